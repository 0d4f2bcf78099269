"""Vector data for training, validation and benchmarks (installed as ``vq.datasets``)."""

from vq.datasets.synthetic import anisotropic_vectors, clustered_vectors

__all__ = ["anisotropic_vectors", "clustered_vectors"]
