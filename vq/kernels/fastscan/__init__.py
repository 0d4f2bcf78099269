"""4-bit fast-scan: packed blocks, byte-shuffle look-ups, flat and IVF scans."""
