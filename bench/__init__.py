"""Reproducible comparisons against faiss (not installed; run ``python -m bench.<name>``)."""

import os

# The OpenMP wait setting vq makes when imported (see vq/__init__.py), made here as well: the
# benchmarks load faiss, whose own OpenMP runtime reads it once, before vq
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"
