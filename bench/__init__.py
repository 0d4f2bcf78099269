"""Reproducible comparisons against faiss (not installed; run ``python -m bench.<name>``)."""

import os

# The OpenMP wait setting vq makes when imported (see vq/__init__.py), made here as well: the
# benchmarks load faiss, whose own OpenMP runtime reads it once, before vq
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"

# The benchmarks time the kernels: a kernel compiles where it is first called (in the first,
# discarded, timing round) instead of in the background while the torch path answers, which
# would time the torch path. bench.coldstart and bench.freshstart give their children the
# user's default (background compiles) back.
BACKGROUND_SETTING = os.environ.get("VQ_BACKGROUND_COMPILE")
os.environ["VQ_BACKGROUND_COMPILE"] = "0"
