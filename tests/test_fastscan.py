"""4-bit PQ fast-scan: layout, both kernels against a reference, faiss parity, factory, I/O."""

import numpy as np
import pytest
import torch

import vq
from vq._cpu import torch_only
from vq.kernels.common.bundles import PackedLists, Probes, ScaledTopK, Tables
from vq.kernels.fastscan import fastscan_scans as fs
from vq.kernels.fastscan.fastscan_ivf import ivf_fastscan_lists

faiss = pytest.importorskip("faiss")

NONE = np.zeros(0, np.uint8)  # no filter


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    d = 32
    x = rng.standard_normal((6000, d)).astype(np.float32) * np.exp(-np.arange(d) / 12)
    x = (x @ rng.standard_normal((d, d))).astype(np.float32)
    q = (x[:200] + 0.05 * rng.standard_normal((200, d))).astype(np.float32)
    return x, q


def recall(I, truth):
    return np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(I, truth, strict=True)])


def test_pack_unpack_and_faiss_layout(data):
    x, _ = data
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 16, (77, 8)).astype(np.uint8)
    packed = fs.pack_codes(codes)
    assert packed.shape == (3, 4, 32)
    np.testing.assert_array_equal(fs.unpack_codes(packed, 77), codes)
    f = faiss.IndexPQFastScan(32, 8, 4)
    f.train(x[:2000])
    f.add(x[:77])
    expected = vq.faiss_interop.unpack_codes(f.pq.compute_codes(x[:77]), 8, 4)
    raw = faiss.vector_to_array(f.codes).reshape(-1, 4, 32)
    np.testing.assert_array_equal(fs.unpack_codes(raw, 77), expected)
    np.testing.assert_array_equal(fs.pack_codes(expected), raw)


def reference_topk(luts, bias, codes, rows, k):
    """Sums of the quantized tables over plain codes, stable sort: the kernels' contract."""
    M = codes.shape[1]
    t = luts.reshape(M // 2, 2, 16).reshape(M, 16).astype(np.int64)
    d = t[np.arange(M), codes].sum(1) + bias
    order = np.argsort(d, kind="stable")[:k]
    return d[order], rows[order]


def needs(isa):
    if (isa == "avx512" and not fs.has_avx512()) or (isa == "avx2" and not fs.has_avx2()):
        pytest.skip(f"no {isa} on this CPU")


@pytest.mark.parametrize(
    "isa, n_queries, M",
    [
        ("avx512", 3, 16),
        ("avx512", 1, 14),
        ("avx2", 1, 16),
        ("avx2", 3, 16),
        ("avx2", 5, 14),
        ("portable", 3, 16),
    ],
)
def test_flat_kernel_equals_reference(isa, n_queries, M):
    """M = 14: an odd number of pairs, the last one read by a 32-byte shuffle in AVX-512.
    AVX2 with 5 queries: one pass over the rows per nibble half (shuffle.JOINT_QUERIES)."""
    needs(isa)
    rng = np.random.default_rng(2)
    n, nq, k = 1000, n_queries * max(2, 6 // n_queries), 7
    codes = rng.integers(0, 16, (n, M)).astype(np.uint8)
    tables = rng.standard_normal((nq, 1, M, 16)).astype(np.float32)
    luts = np.empty((nq, 1, M // 2, 32), np.uint8)
    bias_q = np.empty((nq, 1), np.int32)
    scale, offset = np.empty(nq, np.float32), np.empty(nq, np.float32)
    fs.quantize_all(tables, np.zeros((nq, 1), np.float32), luts, bias_q, scale, offset)
    dist, idx = np.empty((nq, k), np.float32), np.empty((nq, k), np.int64)
    scan = fs.pq_fastscan_scanner(M // 2, n_queries, isa)
    scan(luts.reshape(-1, 32), fs.pack_codes(codes).reshape(-1, 32), n, NONE, dist, idx)
    for q in range(nq):
        d, r = reference_topk(luts[q, 0], 0, codes, np.arange(n), k)
        np.testing.assert_array_equal(idx[q], r)
        np.testing.assert_array_equal(dist[q], d)
    # one pass of queries only (fewer than threads: the blocks are split between threads)
    few = np.empty((n_queries, k), np.float32), np.empty((n_queries, k), np.int64)
    flat_luts = luts.reshape(-1, 32)[: n_queries * (M // 2)]
    scan(flat_luts, fs.pack_codes(codes).reshape(-1, 32), n, NONE, *few)
    np.testing.assert_array_equal(few[0], dist[:n_queries])
    np.testing.assert_array_equal(few[1], idx[:n_queries])


@pytest.mark.parametrize("inner_product", [False, True])
def test_flat_tables_equal_quantized_reference(inner_product):
    """The flat scan's table kernel (vector rows, quantized in place) against tables computed
    in numpy and quantized by quantize_all; integer values keep both exact."""
    rng = np.random.default_rng(4)
    M, dsub, nq = 8, 3, 5
    codebooks = rng.integers(-4, 5, (M, 16, dsub)).astype(np.float32)
    queries = rng.integers(-3, 4, (nq, M * dsub)).astype(np.float32)
    luts = np.full((nq + 2, M // 2, 32), 7, np.uint8)
    scale, offset = np.empty(nq, np.float32), np.empty(nq, np.float32)
    build = fs.flat_tables(M, dsub)
    build(queries, codebooks.transpose(0, 2, 1).copy(), (codebooks**2).sum(-1), inner_product,
          luts, scale, offset)  # fmt: skip
    subs = queries.reshape(nq, M, 1, dsub)
    if inner_product:
        tables = -(subs * codebooks).sum(-1)
    else:
        tables = ((subs - codebooks) ** 2).sum(-1)
    ref = np.empty((nq, 1, M // 2, 32), np.uint8)
    ref_scale, ref_offset = np.empty(nq, np.float32), np.empty(nq, np.float32)
    fs.quantize_all(tables[:, None].astype(np.float32), np.zeros((nq, 1), np.float32), ref,
                    np.empty((nq, 1), np.int32), ref_scale, ref_offset)  # fmt: skip
    np.testing.assert_array_equal(luts[:nq], ref[:, 0])
    np.testing.assert_array_equal(scale, ref_scale)
    np.testing.assert_array_equal(offset, ref_offset)
    assert (luts[nq:] == 7).all()  # rows past nq untouched


@pytest.mark.parametrize("isa", fs.ISAS)
def test_ivf_kernel_equals_reference(isa):
    """The list-major IVF scan against brute force over the same quantized tables; integer
    codebooks and queries make the float tables exact, so both sides quantize alike."""
    needs(isa)
    from vq.kernels import IP_TABLE

    rng = np.random.default_rng(3)
    M, nlist, nq, nprobe, k = 16, 5, 7, 3, 9  # dsub 2: the kernel the index tests use
    sizes = np.array([0, 40, 7, 100, 33])
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    codes = rng.integers(0, 16, (offsets[-1], M)).astype(np.uint8)
    packed, list_blocks = fs.pack_lists(codes, offsets)
    probes = np.array([rng.permutation(nlist)[:nprobe] for _ in range(nq)], dtype=np.int64)
    probes[0, 1] = -1
    codebooks = rng.integers(-4, 5, (M, 16, 2)).astype(np.float32)
    queries = rng.integers(-3, 4, (nq, 2 * M)).astype(np.float32)
    list_tables = rng.integers(0, 6, (nlist, M * 16)).astype(np.float32)
    base = rng.uniform(0, 3, (nq, nprobe)).astype(np.float32)
    dist, idx = np.empty((nq, k), np.float32), np.empty((nq, k), np.int64)
    scale, offset = np.empty(nq, np.float32), np.empty(nq, np.float32)
    scan = ivf_fastscan_lists(M // 2, 2, isa)
    codebooks_t, norms = codebooks.transpose(0, 2, 1).copy(), (codebooks**2).sum(-1)
    no_centroids = np.zeros((nlist, M), np.float32)
    inputs = Tables(codebooks_t, norms, no_centroids, list_tables, IP_TABLE, np.float32(-1.0), True)
    lists = PackedLists(list_blocks, offsets, packed)
    scan(
        queries,
        inputs,
        lists,
        Probes(probes, base),
        NONE,
        ScaledTopK(dist, idx, scale, offset),
        True,
    )
    # the same tables in numpy, quantized by the same function
    ip = -np.einsum("nmd,mjd->nmj", queries.reshape(nq, M, 2), codebooks)  # [nq, M, 16]
    tables = ip[:, None] + list_tables[probes.clip(0)].reshape(nq, nprobe, M, 16)
    luts = np.empty((nq, nprobe, M // 2, 32), np.uint8)
    bias_q = np.empty((nq, nprobe), np.int32)
    ref_scale, ref_offset = np.empty(nq, np.float32), np.empty(nq, np.float32)
    fs.quantize_all(tables.astype(np.float32), base, luts, bias_q, ref_scale, ref_offset)
    np.testing.assert_array_equal(scale, ref_scale)
    for q in range(nq):
        cand = []
        for p, lst in enumerate(probes[q]):
            if lst < 0:
                continue
            rows = np.arange(offsets[lst], offsets[lst + 1])
            d, r = reference_topk(luts[q, p], bias_q[q, p], codes[rows], rows, len(rows))
            cand += list(zip(d.tolist(), r.tolist(), strict=True))
        best = sorted(cand)[:k]  # by distance, then row
        expected = np.float32([d for d, _ in best]) / scale[q] + offset[q]  # back to floats
        np.testing.assert_array_equal(dist[q], expected)
        np.testing.assert_array_equal(idx[q], [r for _, r in best])
    # one query at a time (fewer queries than threads: the probes are split between threads)
    for q in (1, 4):
        one = np.empty((1, k), np.float32), np.empty((1, k), np.int64)
        probed = Probes(probes[q : q + 1], base[q : q + 1])
        scan(
            queries[q : q + 1],
            inputs,
            lists,
            probed,
            NONE,
            ScaledTopK(*one, scale[:1].copy(), offset[:1].copy()),
            True,
        )
        np.testing.assert_array_equal(one[0][0], dist[q])
        np.testing.assert_array_equal(one[1][0], idx[q])
    # unranked (re-ranking candidates): the same results in some order
    loose = np.empty((nq, k), np.float32), np.empty((nq, k), np.int64)
    out = ScaledTopK(*loose, scale.copy(), offset.copy())
    scan(queries, inputs, lists, Probes(probes, base), NONE, out, False)
    order = np.lexsort((loose[1], loose[0]), axis=1)
    np.testing.assert_array_equal(np.take_along_axis(loose[0], order, 1), dist)
    np.testing.assert_array_equal(np.take_along_axis(loose[1], order, 1), idx)


@pytest.mark.parametrize("desc", ["PQ16x4fs", "IVF16,PQ16x4fs", "IVF16,PQ16x4fsr"])
def test_imported_from_faiss_gives_faiss_answers(data, desc):
    x, q = data
    ref = faiss.index_factory(32, desc)
    ref.train(x[:4000])
    ref.add(x)
    index = vq.index.from_faiss(ref)
    assert index.fast_scan and index.ntotal == len(x)
    truth = faiss.knn(q, x, 10)[1]
    for nprobe in (1, 4, 16) if "IVF" in desc else (None,):
        if nprobe:
            faiss.extract_index_ivf(ref).nprobe = nprobe
        Df, If = ref.search(q, 10)
        D, I = index.search(q, 10, **({"nprobe": nprobe} if nprobe else {}))
        np.testing.assert_allclose(D, Df, rtol=1e-5, atol=1e-4)  # same quantized distances
        assert abs(recall(I, truth) - recall(If, truth)) <= 0.005
        assert np.mean([len(set(a) & set(b)) for a, b in zip(I, If, strict=True)]) >= 9.0
    back = index.to_faiss()
    if "IVF" in desc:
        faiss.extract_index_ivf(back).nprobe = faiss.extract_index_ivf(ref).nprobe
    np.testing.assert_array_equal(back.search(q, 10)[1], ref.search(q, 10)[1])


def test_factory_refine_save_load_and_torch_path(data, tmp_path):
    x, q = data
    truth = faiss.knn(q, x, 10)[1]
    index = vq.index_factory(32, "OPQ16,IVF16,PQ16x4fs,RFlat")
    inner = index.index.index
    assert isinstance(inner, vq.IVFPQ) and inner.fast_scan and inner.nbits == 4
    index.train(x[:4000])
    index.add(x)
    base = recall(index.search(q, 10, nprobe=8, k_factor=1)[1], truth)
    refined = recall(index.search(q, 10, nprobe=8, k_factor=8)[1], truth)
    assert refined > base + 0.1
    D, I = index.search(q, 10, nprobe=8, k_factor=8)
    index.save(tmp_path / "fs.vq")
    loaded = vq.load_index(tmp_path / "fs.vq")
    assert loaded.index.index.fast_scan
    D2, I2 = loaded.search(q, 10, nprobe=8, k_factor=8)
    np.testing.assert_array_equal(I2, I)
    with torch_only():  # float tables: at least the fast-scan's recall
        It = loaded.search(q, 10, nprobe=8, k_factor=8)[1]
    assert recall(It, truth) >= refined - 0.01
    # adding and removing rebuilds the packed copy
    loaded.remove_ids(np.arange(0, len(x), 2))
    _, I3 = loaded.search(q, 10, nprobe=8, k_factor=8)
    assert not np.isin(I3[I3 >= 0] % 2, [0]).any()


def test_flat_fast_scan_matches_plain_4bit_pq(data):
    x, q = data
    plain = vq.PQIndex(32, 16, nbits=4)
    plain.train(x[:4000])
    plain.add(x)
    fast = vq.PQIndex(32, 16, nbits=4, fast_scan=True)
    fast.pq.load_state_dict(plain.pq.state_dict())
    fast.add(torch.from_numpy(x))
    truth = faiss.knn(q, x, 10)[1]
    assert abs(recall(fast.search(q, 10)[1], truth) - recall(plain.search(q, 10)[1], truth)) < 0.02


@pytest.mark.parametrize("kwargs", [{"nbits": 8}, {"M": 15}])
def test_fast_scan_needs_4_bits_and_even_M(kwargs):
    args = {"M": 16, "nbits": 4, **kwargs}
    with pytest.raises(ValueError, match="fast_scan needs 4-bit codes and an even M"):
        vq.PQIndex(60 if args["M"] == 15 else 32, args["M"], args["nbits"], fast_scan=True)
    with pytest.raises(ValueError, match="fast_scan needs 4-bit codes"):
        vq.index_factory(32, "PQ16x8fs")


def test_factory_residual_flag_follows_faiss():
    """faiss's "x4fs" IVF encodes the vectors themselves, "x4fsr" the residuals."""
    for desc in ("IVF16,PQ16x4fs", "IVF16,PQ16x4fsr"):
        ours = vq.index_factory(32, desc)
        theirs = faiss.extract_index_ivf(faiss.index_factory(32, desc))
        assert ours.fast_scan and ours.by_residual == theirs.by_residual
    with pytest.raises(ValueError, match="cannot read 'PQ16x4fsr'"):
        vq.index_factory(32, "PQ16x4fsr")  # residuals need an IVF


@pytest.mark.parametrize("desc", ["IVF16,PQ16x4fs", "IVF16,PQ16x4fsr"])
def test_independent_training_recall_matches_faiss(data, desc):
    """Each library trains its own index: at the same parameters vq's recall is at least
    faiss's, less 0.01 (20 of the 2000 neighbours: training noise on this small set; bench.ann
    measures the gap on 1M vectors). vq's coarse k-means often makes it higher (+0.01-0.03)."""
    x, q = data
    truth = faiss.knn(q, x, 10)[1]
    ref = faiss.index_factory(32, desc)
    ref.train(x[:4000])
    ref.add(x)
    ours = vq.index_factory(32, desc)
    ours.train(x[:4000])
    ours.add(x)
    for nprobe in (2, 8):
        faiss.extract_index_ivf(ref).nprobe = nprobe
        theirs = recall(ref.search(q, 10)[1], truth)
        assert recall(ours.search(q, 10, nprobe=nprobe)[1], truth) >= theirs - 0.01, nprobe


def test_small_searches_run_on_one_thread_with_the_same_answers(data, monkeypatch):
    """A search estimated below ``SERIAL_WORK`` runs its kernels on the calling thread (a
    thread pool wake-up costs more); the answers are the same and numba's count comes back."""
    import numba

    from vq import _cpu

    x, q = data
    index = vq.index_factory(32, "IVF16,PQ16x4fs")
    index.train(x[:4000])
    index.add(x)
    threads = numba.get_num_threads()
    seen = []
    real = _cpu.serial_if_small

    def spy(work):
        seen.append(work)
        return real(work)

    monkeypatch.setattr(vq.index.core.search_paths, "serial_if_small", spy)
    lean = vq.index.core.lean
    monkeypatch.setattr(lean, "SPLIT_BATCH", lean.SMALL_BATCH)  # (general)
    for serial_work in (0, float("inf")):  # never / always on one thread
        monkeypatch.setattr(_cpu, "SERIAL_WORK", serial_work)
        D, I = index.search(q, 10, nprobe=4)
        if serial_work == 0:
            expected = D, I
        assert numba.get_num_threads() == threads
    np.testing.assert_array_equal(I, expected[1])
    np.testing.assert_array_equal(D, expected[0])
    assert len(seen) == 2 and seen[0] > 0


@pytest.mark.parametrize("desc", ["PQ16x4fs", "IVF16,PQ16x4fs", "IVF16,PQ16x4fsr,RFlat"])
def test_empty_query_batch(data, desc):
    """No queries: empty results of the right shape (a small search runs on one thread, where
    the IVF kernel once divided by its zero query slices)."""
    x, q = data
    index = vq.index_factory(32, desc)
    index.train(x[:4000])
    index.add(x)
    D, I = index.search(q[:0], 10)
    assert D.shape == I.shape == (0, 10)
    assert D.dtype == np.float32 and I.dtype == np.int64


def test_flat_query_blocks_give_the_portable_answers(data, monkeypatch):
    """The flat scan serves 5, 3 or 1 queries per pass with AVX2 (the largest a batch fills,
    padded to whole passes): every batch size gets the portable kernel's answers."""
    needs("avx2")
    from vq import _cpu

    x, q = data
    index = vq.index_factory(32, "PQ16x4fs")
    index.train(x[:4000])
    index.add(x)
    sizes = (1, 2, 4, 7)
    assert [fs.flat_query_block("avx2", nq) for nq in sizes] == [1, 1, 3, 5]
    assert [fs.flat_query_block("portable", nq) for nq in sizes] == [1, 1, 3, 3]
    monkeypatch.setattr(_cpu, "SERIAL_WORK", 0)  # the general path, not the lean one
    answers = {}
    for isa in ("portable", "avx2"):
        monkeypatch.setenv("VQ_FASTSCAN_ISA", isa)
        answers[isa] = [index.search(q[:nq], 10) for nq in sizes]
    for (D, I), (Dp, Ip) in zip(answers["avx2"], answers["portable"], strict=True):
        np.testing.assert_array_equal(I, Ip)
        np.testing.assert_array_equal(D, Dp)


def test_isa_follows_numba_target_features(monkeypatch):
    """With NUMBA_CPU_FEATURES naming no AVX-512 (an AVX2 build on an AVX-512 host), no
    AVX-512 kernel is chosen or allowed: LLVM would abort the process compiling one."""
    monkeypatch.setattr(fs.numba_config, "CPU_FEATURES", "+avx,+avx2,-avx512f,-avx512bw")
    monkeypatch.delenv("VQ_FASTSCAN_ISA", raising=False)
    fs.target_features.cache_clear()
    try:
        assert fs.has_avx2() and not fs.has_avx512()
        assert fs.best_isa() == "avx2"
        with pytest.raises(ValueError, match="lacks avx512"):
            fs.check_isa("avx512")
    finally:
        monkeypatch.undo()
        fs.target_features.cache_clear()
