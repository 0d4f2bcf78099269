"""Properties that hold for any input (hypothesis, derandomized: the same examples every run).

- decode(encode(x)) on the training set is no worse than the training distortion: k-means's
  last recorded objective; one more Lloyd iteration never makes PQ worse; and encode picks the
  best code (no other code reconstructs a vector better).
- Flat search equals brute force in float64, on both the numba and the torch path.
- codes always lie in [0, codebook_size), whatever the vectors.
- save/load round-trips random indexes (kinds, metrics, ids, removals, search options).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import vq
from vq._cpu import torch_only
from vq.quantizers import OPQ, ProductQuantizer

FAST = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FEW = settings(FAST, max_examples=8)  # examples that train something


def blobs(seed: int, n: int, d: int, clusters: int, scale: float) -> np.ndarray:
    """Continuous data (no exact duplicates): Gaussian blobs of the given spread."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, d)) * 3
    x = centres[rng.integers(0, clusters, n)] + rng.standard_normal((n, d)) * scale
    return x.astype(np.float32)


def sq_errors(x: np.ndarray, x_hat) -> np.ndarray:
    diff = x.astype(np.float64) - np.asarray(x_hat, dtype=np.float64)
    return (diff * diff).sum(axis=-1)


# -- reconstruction error bounds -------------------------------------------------------------------
@FEW
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(40, 400),
    d=st.integers(1, 12),
    k=st.sampled_from([2, 3, 8, 16]),
    niter=st.integers(1, 6),
    scale=st.sampled_from([0.01, 0.3, 1.0]),
)
def test_vq_error_is_at_most_the_last_training_objective(seed, n, d, k, niter, scale):
    x = blobs(seed, n, d, clusters=5, scale=scale)
    q = vq.VectorQuantizer(d, k, niter=niter, seed=seed).fit(x)
    # the same training (VectorQuantizer seeds with k-means++), with its objective
    result = vq.kmeans(x, k, niter=niter, init="k-means++", seed=seed)
    np.testing.assert_array_equal(q.codebook.numpy(), result.centroids)
    error = sq_errors(x, q.decode(q.encode(x))).sum()
    # float32 distances (||x||² - 2⟨x, c⟩ + ||c||²) are exact to about 1e-7 of ||x||²
    rounding = 1e-6 * float((x.astype(np.float64) ** 2).sum()) + 1e-6
    assert abs(error - result.inertia) <= 1e-4 * error + rounding
    # Lloyd: reassigning to the nearest of the updated centroids only lowers the distortion
    # measured at the last assignment step
    assert error <= result.objective[-1] * (1 + 1e-4) + rounding


@FEW
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(64, 400),
    M=st.sampled_from([1, 2, 4]),
    dsub=st.integers(1, 3),
    nbits=st.integers(1, 4),
    niter=st.integers(1, 5),
)
def test_pq_error_never_grows_with_training(seed, n, M, dsub, nbits, niter):
    d = M * dsub
    x = blobs(seed, n, d, clusters=6, scale=0.5)
    errors = []
    for iters in (niter, niter + 1):
        pq = ProductQuantizer(d, M, nbits, niter=iters, seed=seed).fit(x)
        errors.append(sq_errors(x, pq.decode(pq.encode(x))).sum())
    rounding = 1e-6 * float((x.astype(np.float64) ** 2).sum()) + 1e-6
    assert errors[1] <= errors[0] * (1 + 1e-4) + rounding


@FEW
@given(
    seed=st.integers(0, 2**16),
    kind=st.sampled_from(["vq", "pq", "opq"]),
    nbits=st.integers(1, 4),
)
def test_encode_picks_the_best_code(seed, kind, nbits):
    """No code reconstructs a vector better than the one encode chose (checked against every
    code for a single table, against 64 random codes otherwise)."""
    d, K = 8, 1 << nbits
    x = blobs(seed, 200, d, clusters=4, scale=0.7)
    if kind == "vq":
        q = vq.VectorQuantizer(d, K, niter=3, seed=seed).fit(x)
        candidates = np.arange(K)[:, None].repeat(len(x), 1)  # [K, n]
    else:
        q = ProductQuantizer(d, 4, nbits, niter=3) if kind == "pq" else OPQ(d, 4, nbits, niter=3)
        q.fit(x)
        candidates = np.random.default_rng(seed).integers(0, K, (64, len(x), 4))
    best = sq_errors(x, q.decode(q.encode(x)))
    for codes in candidates:
        other = sq_errors(x, q.decode(codes))
        assert (best <= other * (1 + 1e-5) + 1e-5).all()


# -- search ---------------------------------------------------------------------------------------
@FAST
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(1, 300),
    nq=st.integers(1, 20),
    d=st.integers(1, 24),
    k=st.integers(1, 40),
    metric=st.sampled_from(["l2", "ip"]),
    torch_path=st.booleans(),
)
def test_flat_search_is_brute_force(seed, n, nq, d, k, metric, torch_path):
    rng = np.random.default_rng(seed)
    xb = rng.standard_normal((n, d)).astype(np.float32)
    xq = rng.standard_normal((nq, d)).astype(np.float32)
    index = vq.FlatIndex(d, metric=metric)
    index.add(xb)
    if torch_path:
        with torch_only():
            D, I = index.search(torch.from_numpy(xq), k)
        D, I = D.numpy(), I.numpy()
    else:
        D, I = index.search(xq, k)

    b, q = xb.astype(np.float64), xq.astype(np.float64)
    if metric == "l2":
        exact = ((q[:, None, :] - b[None]) ** 2).sum(-1)  # smaller is better
    else:
        exact = -(q @ b.T)
    kk = min(k, n)
    truth = np.sort(exact, axis=1)[:, :kk]
    tol = 1e-4 * (1 + np.abs(exact).max())
    assert D.dtype == np.float32 and I.dtype == np.int64 and D.shape == I.shape == (nq, k)
    found = D[:, :kk].astype(np.float64) * (1 if metric == "l2" else -1)
    np.testing.assert_allclose(found, truth, atol=tol)  # the k best distances, in order
    ids = I[:, :kk]
    assert ((ids >= 0) & (ids < n)).all()
    assert all(len(set(row)) == kk for row in ids.tolist())  # no id twice
    np.testing.assert_allclose(np.take_along_axis(exact, ids, 1), truth, atol=tol)  # theirs
    assert (I[:, kk:] == -1).all()  # padding past n
    assert (D[:, kk:] == (np.inf if metric == "l2" else -np.inf)).all()


# -- codes ----------------------------------------------------------------------------------------
vectors = arrays(
    np.float32,
    st.tuples(st.integers(1, 30), st.just(6)),
    elements=st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_infinity=False),
)


@pytest.fixture(scope="module")
def quantizers():
    x = blobs(0, 500, 6, clusters=5, scale=0.5)
    return [
        vq.VectorQuantizer(6, 5, niter=3).fit(x),
        ProductQuantizer(6, 3, 2, niter=3).fit(x),
        ProductQuantizer(6, 2, 8, niter=2).fit(x),
        vq.ResidualVQ(6, num_quantizers=3, codebook_size=7, niter=3, refine_iters=0).fit(x),
        vq.ResidualVQ(6, 2, 4, beam_size=3, niter=3, refine_iters=0).fit(x),
        OPQ(6, 3, 2, niter=2, niter_pq=2, niter_pq_0=2, pq_niter=2).fit(x),
    ]


@FAST
@given(x=vectors, torch_path=st.booleans())
def test_codes_are_always_in_range(quantizers, x, torch_path):
    for q in quantizers:
        if torch_path:
            with torch_only():
                codes = q.encode(torch.from_numpy(x)).numpy()
        else:
            codes = q.encode(x)
        assert codes.dtype == np.dtype(str(q.code_dtype).replace("torch.", ""))
        assert codes.shape == (len(x), *q.code_shape)
        assert codes.min() >= 0 and codes.max() < q.codebook_size
        assert np.isfinite(q.decode(codes)).all()


# -- persistence -----------------------------------------------------------------------------------
#: 32 dimensions and PQ8: kernel configurations other tests compile too (each new one costs
#: seconds of compile on a cold cache)
DIM = 32
KINDS = [
    "Flat",
    "PQ8x4",
    "IVF4,Flat",
    "IVF4,PQ8x4",
    "IVF4,PQ8x4fs",
    "OPQ8,IVF4,PQ8x4",
    "OPQ8_16,PQ8x4",
    "IVF4,PQ8x4,RFlat",
    "Flat,Refine(Flat)",
]


@pytest.fixture(scope="module")
def trained():
    """Trains each (kind, metric) the first time an example asks for it."""
    x = blobs(1, 600, DIM, clusters=6, scale=0.5)
    cache = {}

    def get(desc: str, metric: str):
        if (desc, metric) not in cache:
            index = vq.index_factory(DIM, desc, metric=metric)
            for m in index.modules():
                if isinstance(m, OPQ):
                    m.niter, m.niter_pq, m.niter_pq_0 = 1, 1, 1
                elif isinstance(m, ProductQuantizer):
                    m.niter = 2
            cache[desc, metric] = index.train(x)
        return cache[desc, metric]

    return get


@pytest.mark.parametrize("desc", KINDS)
@settings(FAST, max_examples=3)
@given(
    metric=st.sampled_from(["l2", "ip"]),
    seed=st.integers(0, 2**16),
    n=st.integers(0, 300),
    removed=st.integers(0, 50),
    own_ids=st.booleans(),
    nprobe=st.integers(1, 4),
)
def test_save_load_round_trip(tmp_path_factory, trained, desc, metric, seed, n, removed, own_ids,
                              nprobe):  # fmt: skip
    import copy

    rng = np.random.default_rng(seed)
    index = copy.deepcopy(trained(desc, metric))
    x = blobs(seed, n, DIM, clusters=6, scale=0.5)
    if own_ids:
        index.add_with_ids(x, rng.choice(2**40, n, replace=False))
    else:
        index.add(x)
    index.remove_ids(rng.choice(index.stored_ids().numpy(), min(removed, n), replace=False))
    if hasattr(index, "nprobe"):
        index.nprobe = nprobe
    path = tmp_path_factory.mktemp("round-trip") / "index.vqi"
    index.save(path)
    loaded = vq.load_index(path)

    assert type(loaded) is type(index) and loaded.config() == index.config()
    a, b = index.state_dict(), loaded.state_dict()
    assert sorted(a) == sorted(b)
    assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    np.testing.assert_array_equal(loaded.stored_ids().numpy(), index.stored_ids().numpy())
    queries = blobs(seed + 1, 7, DIM, clusters=6, scale=0.5)
    for got, want in zip(loaded.search(queries, 5), index.search(queries, 5), strict=True):
        np.testing.assert_array_equal(got, want)
