import numpy as np
import pytest

import vq
from vq import faiss_interop as fi

faiss = pytest.importorskip("faiss")


def test_pq_round_trip(blobs):
    fpq = faiss.ProductQuantizer(32, 4, 8)
    fpq.train(blobs)
    pq = fi.pq_from_faiss(fpq)
    assert pq.is_trained and (pq.dim, pq.M, pq.nbits) == (32, 4, 8)
    back = fi.pq_to_faiss(pq)  # keep a reference: faiss vectors die with their owner
    np.testing.assert_array_equal(
        faiss.vector_to_array(back.centroids), faiss.vector_to_array(fpq.centroids)
    )
    np.testing.assert_array_equal(pq.encode(blobs[:500]), fpq.compute_codes(blobs[:500]))


def test_rvq_round_trip_and_beam(blobs):
    frq = faiss.ResidualQuantizer(32, 2, 8)
    frq.max_beam_size = 3
    frq.train(blobs)
    rq = fi.rvq_from_faiss(frq)
    assert rq.beam_size == 3 and rq.codebook_size == 256
    back = fi.rvq_to_faiss(rq)
    np.testing.assert_array_equal(back.compute_codes(blobs[:500]), rq.encode(blobs[:500]))
    with pytest.raises(ValueError, match="power-of-two codebook size"):
        fi.rvq_to_faiss(vq.ResidualVQ(32, 2, 100, niter=1).fit(blobs))


def test_opq_round_trip(aniso):
    matrix = faiss.OPQMatrix(32, 4)
    matrix.niter = 5
    matrix.train(aniso)
    fpq = faiss.ProductQuantizer(32, 4, 8)
    fpq.train(matrix.apply(aniso))
    opq = fi.opq_from_faiss(matrix, fpq)
    ref = fpq.compute_codes(matrix.apply(aniso[:500]))
    np.testing.assert_array_equal(opq.encode(aniso[:500]), ref)
    m2, p2 = fi.opq_to_faiss(opq)
    np.testing.assert_array_equal(p2.compute_codes(m2.apply(aniso[:500])), ref)


@pytest.mark.parametrize("M, nbits", [(8, 8), (8, 5), (4, 10), (3, 3)])
def test_code_packing_matches_faiss(blobs, M, nbits):
    dim = 24 if M == 3 else 32
    fpq = faiss.ProductQuantizer(dim, M, nbits)
    fpq.cp.niter = 2
    fpq.train(blobs[:, :dim])
    packed = fpq.compute_codes(blobs[:500, :dim])
    codes = fi.unpack_codes(packed, M, nbits)
    assert codes.shape == (500, M) and int(codes.max()) < 1 << nbits
    np.testing.assert_array_equal(fi.pack_codes(codes, nbits), packed)
    pq = fi.pq_from_faiss(fpq)  # and the unpacked codes are the ones vq computes
    np.testing.assert_array_equal(pq.encode(blobs[:500, :dim]), codes)


def test_pq_codes_stay_exact_far_from_the_origin(blobs):
    """|x|² >> |x - c|²: the expanded distance loses digits; codes must still be the exact
    nearest sub-centroids (as faiss's direct computation finds them)."""
    x = (blobs[:4000] * 0.05 + 300.0).astype(np.float32)  # like log-mel features: offset, narrow
    fpq = faiss.ProductQuantizer(32, 8, 8)
    fpq.cp.niter = 4
    fpq.train(x)
    pq = fi.pq_from_faiss(fpq)
    codes = pq.encode(x)
    np.testing.assert_array_equal(codes, fpq.compute_codes(x))
    cb = pq.codebooks.double().numpy()  # [M, ksub, dsub]
    subs = x.astype(np.float64).reshape(-1, 8, 1, 4)
    exact = ((subs - cb[None]) ** 2).sum(-1).argmin(-1)
    np.testing.assert_array_equal(codes, exact)
