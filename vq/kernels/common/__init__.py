"""What the kernels share: the thread pool, SIMD helpers, heaps, top-k selection, bit masks, fp16
bits, row moves, compile-time constants, exact row distances."""
