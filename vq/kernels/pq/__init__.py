"""Product-quantizer kernels: encoding, decoding and k-means steps, ADC look-up-table scans of flat
and inverted lists."""
