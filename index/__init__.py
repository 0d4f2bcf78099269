"""ANN indexes built from the quantizers (installed as ``vq.index``).

Flat, PQ, IVFFlat, IVFPQ, OPQ pre-transform and re-ranking land here with the index issue.
"""
