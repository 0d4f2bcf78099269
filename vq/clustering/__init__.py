"""Codebook training: k-means (Lloyd, faiss-style) and Linde–Buzo–Gray splitting.

One Lloyd loop serves both. Each iteration is one pass over the data: chunked GEMM
nearest-centroid search, then per-cluster sums, counts and errors with ``index_add_``. Empty
clusters are repaired as faiss does, by splitting a large cluster in two. All randomness comes
from one ``torch.Generator`` seeded on CPU, so a seed fixes the result on every device.

Under ``torch.distributed`` (see :mod:`vq.distributed`) the data are this process's shard of the
concatenation of every process's rows: subsampling and seeding draw global row numbers from the
same generator on every process, each iteration all-reduces the cluster sums and counts, and the
update (empty-cluster repair included) runs identically everywhere on the reduced values, so a
seed gives the centroids of one process holding all the data. Long runs can checkpoint and resume
(:class:`vq.parallel.TrainingRun`).

Modules, bottom up:
    :mod:`.seeding`: the seeded generator, row sampling, k-means++ seeding.
    :mod:`.splitting`: splitting a codeword in two (faiss's empty-cluster repair, LBG's rounds).
    :mod:`.lloyd`: the Lloyd iterations (plain, fused for small CPU jobs, Hamerly-bounded).
    :mod:`.train`: the public :func:`kmeans`, :func:`lbg` and :class:`KMeansResult`.

References:
    S. Lloyd, "Least squares quantization in PCM", IEEE Trans. IT, 1982.
    D. Arthur, S. Vassilvitskii, "k-means++: the advantages of careful seeding", SODA 2007.
    Y. Linde, A. Buzo, R. Gray, "An algorithm for vector quantizer design", IEEE Trans. Comm., 1980.
"""

from vq.clustering.train import KMeansResult, kmeans, lbg

__all__ = ["KMeansResult", "kmeans", "lbg"]
