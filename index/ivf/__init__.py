"""The inverted-file kinds: a coarse quantizer routes each vector to lists, a search scans the lists
nearest to it (lists, probing, spilling, sketches, the IVF kinds)."""
