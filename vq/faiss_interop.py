"""Move trained codebooks between vq quantizers and faiss (``pip install vq[faiss]``).

Same codebooks give the same codes on both sides (ties aside), which is how vq is validated:

    >>> fpq = faiss.ProductQuantizer(128, 16, 8); fpq.train(x)
    >>> pq = vq.faiss_interop.pq_from_faiss(fpq)          # vq.ProductQuantizer
    >>> fpq2 = vq.faiss_interop.pq_to_faiss(pq)            # faiss.ProductQuantizer
    >>> sq = vq.faiss_interop.sq_from_faiss(fsq)          # vq.ScalarQuantizer (and sq_to_faiss)
"""

from __future__ import annotations

import numpy as np
import torch

from vq.quantizers import OPQ, ProductQuantizer, ResidualVQ, ScalarQuantizer, VectorQuantizer


def _faiss():
    try:
        import faiss
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("faiss is not installed: pip install 'vq[faiss]'") from err
    return faiss


def _trained(module, **buffers):
    module.load_state_dict({"trained": torch.tensor(True), **buffers}, strict=False)
    module.mark_trained()
    return module


def _array(vector) -> np.ndarray:
    return _faiss().vector_to_array(vector)


def unpack_codes(packed: np.ndarray, M: int, nbits: int) -> np.ndarray:
    """faiss's packed PQ codes (uint8 [n, ceil(M * nbits / 8)], codes bit after bit, least
    significant bit first) → [n, M] codes (uint8 for nbits <= 8, else int32)."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8).reshape(-1, (M * nbits + 7) // 8)
    if nbits == 8:
        return packed.copy()
    bits = np.unpackbits(packed, axis=1, bitorder="little")[:, : M * nbits].reshape(-1, M, nbits)
    codes = (bits.astype(np.int64) << np.arange(nbits)).sum(-1)
    return codes.astype(np.uint8 if nbits <= 8 else np.int32)


def pack_codes(codes: np.ndarray, nbits: int) -> np.ndarray:
    """[n, M] codes → faiss's packed layout, uint8 [n, ceil(M * nbits / 8)]."""
    codes = np.asarray(codes)
    if nbits == 8:
        return np.ascontiguousarray(codes, dtype=np.uint8)
    bits = ((codes.astype(np.int64)[:, :, None] >> np.arange(nbits)) & 1).astype(np.uint8)
    return np.packbits(bits.reshape(codes.shape[0], -1), axis=1, bitorder="little")


def pq_from_faiss(fpq) -> ProductQuantizer:
    """A trained :class:`vq.ProductQuantizer` holding a ``faiss.ProductQuantizer``'s centroids."""
    cb = _array(fpq.centroids).reshape(fpq.M, fpq.ksub, fpq.dsub)
    return _trained(ProductQuantizer(fpq.d, fpq.M, fpq.nbits), codebooks=torch.from_numpy(cb))


def pq_to_faiss(pq: ProductQuantizer):
    """A ``faiss.ProductQuantizer`` holding ``pq``'s codebooks."""
    faiss = _faiss()
    fpq = faiss.ProductQuantizer(pq.dim, pq.M, pq.nbits)
    faiss.copy_array_to_vector(pq.codebooks.float().cpu().numpy().ravel(), fpq.centroids)
    return fpq


def rvq_from_faiss(frq, beam_size: int | None = None) -> ResidualVQ:
    """A trained :class:`vq.ResidualVQ` from a ``faiss.ResidualQuantizer`` with equal nbits per
    stage; ``beam_size`` defaults to faiss's ``max_beam_size``."""
    nbits = [int(b) for b in _faiss().vector_to_array(frq.nbits)]
    if len(set(nbits)) != 1:
        raise ValueError(f"vq.ResidualVQ needs the same nbits in every stage, got {nbits}")
    k = 1 << nbits[0]
    cb = _array(frq.codebooks).reshape(frq.M, k, frq.d)
    beam = frq.max_beam_size if beam_size is None else beam_size
    return _trained(ResidualVQ(frq.d, frq.M, k, beam), codebooks=torch.from_numpy(cb))


def rvq_to_faiss(rq: ResidualVQ):
    """A ``faiss.ResidualQuantizer`` holding ``rq``'s codebooks (codebook size a power of two)."""
    faiss = _faiss()
    nbits = rq.codebook_size.bit_length() - 1
    if 1 << nbits != rq.codebook_size:
        raise ValueError(f"faiss needs a power-of-two codebook size, got {rq.codebook_size}")
    frq = faiss.ResidualQuantizer(rq.dim, rq.num_quantizers, nbits)
    frq.max_beam_size = rq.beam_size
    faiss.copy_array_to_vector(rq.codebooks.float().cpu().numpy().ravel(), frq.codebooks)
    frq.is_trained = True
    return frq


def opq_from_faiss(opq_matrix, fpq) -> OPQ:
    """A trained :class:`vq.OPQ` from a ``faiss.OPQMatrix`` and the ``ProductQuantizer`` trained
    on its output."""
    rotation = _array(opq_matrix.A).reshape(opq_matrix.d_out, opq_matrix.d_in)
    opq = OPQ(opq_matrix.d_in, fpq.M, fpq.nbits, dim_out=opq_matrix.d_out)
    _trained(opq, rotation=torch.from_numpy(rotation))
    opq.pq = pq_from_faiss(fpq)
    return opq


def opq_to_faiss(opq: OPQ):
    """``(faiss.OPQMatrix, faiss.ProductQuantizer)`` equivalent to ``opq``."""
    faiss = _faiss()
    matrix = faiss.OPQMatrix(opq.dim, opq.M, opq.dim_out)
    faiss.copy_array_to_vector(opq.rotation.float().cpu().numpy().ravel(), matrix.A)
    matrix.is_trained = True
    matrix.is_orthonormal = True
    return matrix, pq_to_faiss(opq.pq)


def kmeans_index_from_centroids(centroids) -> VectorQuantizer:
    """A trained :class:`vq.VectorQuantizer` from ``faiss.Kmeans(...).centroids`` (or any
    [k, d] array)."""
    c = torch.as_tensor(np.ascontiguousarray(centroids, dtype=np.float32))
    return _trained(VectorQuantizer(c.shape[1], c.shape[0]), codebook=c)


#: vq's ScalarQuantizer ``bits`` ↔ the name of faiss's ``ScalarQuantizer.QuantizerType``
SQ_TYPES = {8: "QT_8bit", 6: "QT_6bit", 4: "QT_4bit", "fp16": "QT_fp16", "bf16": "QT_bf16"}


def sq_from_faiss(fsq) -> ScalarQuantizer:
    """A trained :class:`vq.ScalarQuantizer` holding a trained ``faiss.ScalarQuantizer``'s
    per-dimension ranges (``QT_8bit``, ``QT_6bit``, ``QT_4bit``, ``QT_fp16``, ``QT_bf16``)."""
    faiss = _faiss()
    by_value = {getattr(faiss.ScalarQuantizer, name, None): bits for bits, name in SQ_TYPES.items()}
    bits = by_value.get(fsq.qtype)
    if bits is None:
        raise ValueError(
            f"faiss ScalarQuantizer type {fsq.qtype} has no vq counterpart; supported: "
            + ", ".join(SQ_TYPES.values())
        )
    sq = ScalarQuantizer(fsq.d, bits)
    if sq.is_float:
        return sq
    trained = _array(fsq.trained)
    if trained.shape != (2 * fsq.d,):
        raise ValueError(
            f"expected faiss's per-dimension ranges (2 * d = {2 * fsq.d} values), got "
            f"{trained.shape[0]}: train the faiss ScalarQuantizer first (uniform ranges do not "
            "convert)"
        )
    ranges = torch.from_numpy(trained.reshape(2, fsq.d))
    return _trained(sq, vmin=ranges[0].clone(), vdiff=ranges[1].clone())


def sq_to_faiss(sq: ScalarQuantizer):
    """A trained ``faiss.ScalarQuantizer`` holding ``sq``'s ranges (``RS_minmax``)."""
    faiss = _faiss()
    fsq = faiss.ScalarQuantizer(sq.dim, getattr(faiss.ScalarQuantizer, SQ_TYPES[sq.bits]))
    if not sq.is_float:
        ranges = torch.stack([sq.vmin, sq.vdiff]).float().cpu().numpy().ravel()
        faiss.copy_array_to_vector(ranges, fsq.trained)
    fsq.rangestat_arg = sq.margin
    return fsq
