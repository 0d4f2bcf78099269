"""Data for training, validation and benchmarks (installed as ``vq.datasets``).

- NSynth: :class:`NSynth` reads the json/wav layout (a real download or a generated set),
  :func:`synthesize_nsynth` writes an NSynth-format set of synthesized notes,
  :func:`embed_nsynth` turns notes into vectors with torchaudio.
- Vector files: ``read_/write_`` ``fvecs``, ``ivecs``, ``bvecs``; :func:`read_ann_hdf5`;
  :func:`ground_truth` (exact neighbours, chunked).
- Synthetic vectors: :func:`clustered_vectors`, :func:`anisotropic_vectors`.
"""

from vq.datasets.ann_hdf5 import AnnDataset, read_ann_hdf5
from vq.datasets.embed import embed_nsynth, embedding_dim
from vq.datasets.exact_knn import GroundTruth, ground_truth, recall_at
from vq.datasets.nsynth import FAMILIES, QUALITIES, SOURCES, NSynth
from vq.datasets.synth_nsynth import synthesize_nsynth
from vq.datasets.synthetic import anisotropic_vectors, clustered_vectors
from vq.datasets.vecs import (
    read_bvecs,
    read_fvecs,
    read_ivecs,
    vecs_shape,
    write_bvecs,
    write_fvecs,
    write_ivecs,
)

__all__ = [
    "FAMILIES",
    "QUALITIES",
    "SOURCES",
    "AnnDataset",
    "GroundTruth",
    "NSynth",
    "anisotropic_vectors",
    "clustered_vectors",
    "embed_nsynth",
    "embedding_dim",
    "ground_truth",
    "read_ann_hdf5",
    "read_bvecs",
    "read_fvecs",
    "read_ivecs",
    "recall_at",
    "synthesize_nsynth",
    "vecs_shape",
    "write_bvecs",
    "write_fvecs",
    "write_ivecs",
]
