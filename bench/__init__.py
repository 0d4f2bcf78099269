"""Reproducible comparisons against faiss (not installed; run ``python -m bench.<name>``)."""

# vq sets how OpenMP threads wait between parallel regions (see vq/__init__.py); importing it
# before faiss gives faiss's own OpenMP runtime the same setting, so both run alike
import vq  # noqa: F401
