"""Reproducible comparisons against faiss (not installed; run ``python -m bench.<name>``)."""
