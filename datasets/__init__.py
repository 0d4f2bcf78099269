"""Data for training, validation and benchmarks (installed as ``vq.datasets``).

- NSynth: :class:`NSynth` reads the json/wav layout (a real download or a generated set),
  :func:`synthesize_nsynth` writes an NSynth-format set of synthesized notes,
  :func:`embed_nsynth` turns notes into vectors with torchaudio.
- Vector files: :func:`open_vectors` / :func:`read_vectors` and :func:`read_neighbors` read
  every format below by its suffix (what the command lines use); ``read_/write_`` ``fvecs``,
  ``ivecs``, ``bvecs`` (TEXMEX), ``fbin``, ``u8bin``, ``i8bin``, ``ibin``
  (big-ann-benchmarks); :func:`read_ann_hdf5` and :func:`ann_metric` (ann-benchmarks);
  :func:`ground_truth` (exact neighbours, chunked).
- Synthetic vectors: :func:`clustered_vectors`, :func:`anisotropic_vectors`.
"""

from vq.datasets.ann_hdf5 import AnnDataset, ann_metric, read_ann_hdf5
from vq.datasets.bigann import (
    bin_shape,
    read_fbin,
    read_i8bin,
    read_ibin,
    read_u8bin,
    write_fbin,
    write_i8bin,
    write_ibin,
    write_u8bin,
)
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
from vq.datasets.vector_files import (
    VectorFile,
    open_neighbors,
    open_vectors,
    read_neighbors,
    read_vectors,
)

__all__ = [
    "FAMILIES",
    "QUALITIES",
    "SOURCES",
    "AnnDataset",
    "GroundTruth",
    "NSynth",
    "VectorFile",
    "anisotropic_vectors",
    "ann_metric",
    "bin_shape",
    "clustered_vectors",
    "embed_nsynth",
    "embedding_dim",
    "ground_truth",
    "open_neighbors",
    "open_vectors",
    "read_ann_hdf5",
    "read_bvecs",
    "read_fbin",
    "read_fvecs",
    "read_i8bin",
    "read_ibin",
    "read_ivecs",
    "read_neighbors",
    "read_u8bin",
    "read_vectors",
    "recall_at",
    "synthesize_nsynth",
    "vecs_shape",
    "write_bvecs",
    "write_fbin",
    "write_fvecs",
    "write_i8bin",
    "write_ibin",
    "write_ivecs",
    "write_u8bin",
]
