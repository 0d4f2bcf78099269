"""Filtered search graphs (``filtered=True``): the mask over the ids is a second input of fixed
shape, and the graphs return what the index's own filtered search returns, in torch and in
ONNX Runtime."""

import numpy as np
import pytest
import torch
from export_helpers import (
    DIM,
    INDEXES,
    assert_same_search,
    fixture_data,  # noqa: F401 (a fixture)
    fixture_exported,  # noqa: F401 (a fixture)
    fixture_indexes,  # noqa: F401 (a fixture)
    fixture_ort,  # noqa: F401 (a fixture)
    fixture_queries,  # noqa: F401 (a fixture)
    torch_path,
)
from index_kinds import EXPORTED

import vq
from vq.export import OnnxRunner, audit, export_module


def _mask(index, fraction: float, seed: int) -> np.ndarray:
    """bool [largest id + 1]: a random ``fraction`` of the index's ids allowed."""
    ids = index.stored_ids().numpy()
    mask = np.zeros(int(ids.max()) + 1, bool)
    rng = np.random.default_rng(seed)
    mask[rng.choice(ids, max(1, int(fraction * len(ids))), replace=False)] = True
    return mask


def _nprobe(index) -> dict:
    return {"nprobe": 8} if any(hasattr(m, "nlist") for m in index.modules()) else {}


@pytest.mark.parametrize("name", INDEXES)
def test_filtered_graph_equals_the_filtered_torch_path(indexes, queries, name):
    index = indexes(name)
    options = _nprobe(index)  # every list probed: the CPU search never needs to probe further
    module = export_module(index, k=7, filtered=True, **options)
    assert [spec.name for spec in module.inputs] == ["queries", "allowed"]
    assert module.metadata["filtered"] == "true"
    q = torch.from_numpy(queries[:20])
    for fraction, seed in ((0.5, 0), (0.05, 1)):
        mask = _mask(index, fraction, seed)
        D, I = module(q, torch.from_numpy(mask))
        D_ref, I_ref = torch_path(index, "search", q, k=7, allowed=mask, **options)
        assert_same_search(D, I, D_ref, I_ref)
        assert np.isin(I[I >= 0].numpy(), np.flatnonzero(mask)).all()
        if "fastscan" not in name:  # the CPU fast-scan ranks by uint8 tables, the graph by float
            D_cpu, I_cpu = index.search(q, 7, allowed=vq.IdFilter(mask), **options)
            assert_same_search(D, I, D_cpu, I_cpu)


@pytest.mark.parametrize("name", ["Flat-ip-ids", "IVFPQ-l2", "OPQ-IVFPQ-RFlat-l2"])
def test_filtered_onnx_equals_the_index_search(indexes, queries, exported, name):
    index = indexes(name)
    options = _nprobe(index)
    path = exported(index, batch_size=8, k=5, filtered=True, **options)
    runner = OnnxRunner(path, threads=1)
    assert runner.id_space == int(index.stored_ids().max()) + 1
    report = audit(path)
    assert report.clean, str(report)
    assert report.inputs[1] == f"allowed: bool[{runner.id_space}]"
    mask = _mask(index, 0.2, 2)
    q = queries[:19]  # three batches, the last one padded
    D, I = runner(q, allowed=mask)
    D_ref, I_ref = index.search(torch.from_numpy(q), 5, allowed=mask, **options)
    assert_same_search(D, I, D_ref.numpy(), I_ref.numpy())
    ids = np.flatnonzero(mask)  # the same filter given as ids or as a vq.IdFilter
    assert np.array_equal(runner(q, allowed=ids)[1], I)
    assert np.array_equal(runner(q, allowed=vq.IdFilter(ids))[1], I)


def test_filtered_onnx_with_a_dynamic_batch(indexes, queries, exported):
    index = indexes("IVFFlat-l2-ids")
    path = exported(index, batch_size=4, k=5, nprobe=8, filtered=True, dynamic_batch=True)
    runner = OnnxRunner(path)
    assert runner.batch_size is None
    mask = _mask(index, 0.3, 3)
    D, I = runner(queries[:13], allowed=mask)
    D_ref, I_ref = index.search(torch.from_numpy(queries[:13]), 5, allowed=mask, nprobe=8)
    assert_same_search(D, I, D_ref.numpy(), I_ref.numpy())


def test_runner_asks_for_the_mask_and_refuses_one_it_cannot_use(indexes, queries, exported):
    index = indexes("Flat-l2")
    filtered = OnnxRunner(exported(index, batch_size=4, k=3, filtered=True))
    with pytest.raises(ValueError, match="filtered search: pass allowed="):
        filtered(queries[:4])
    with pytest.raises(ValueError, match="does not cover the stored id"):
        filtered(queries[:4], allowed=np.ones(10, bool))
    plain = OnnxRunner(exported(index, batch_size=4, k=3))
    assert plain.id_space is None
    with pytest.raises(ValueError, match="takes no filter; export the search with filtered=True"):
        plain(queries[:4], allowed=np.ones(index.ntotal, bool))


def test_filtered_export_refusals(indexes, data):
    with pytest.raises(ValueError, match="filtered applies to the search of an index"):
        export_module(
            vq.ProductQuantizer(DIM, 4, 4).fit(torch.from_numpy(data[:500])), filtered=True
        )
    hnsw = vq.HNSW(DIM, M=8)
    hnsw.add(torch.from_numpy(data[:300]))
    with pytest.raises(ValueError, match="HNSW search graph takes no filter"):
        export_module(hnsw, k=5, filtered=True)
    huge = vq.FlatIndex(DIM)
    huge.add_with_ids(torch.from_numpy(data[:3]), torch.tensor([0, 1, 1 << 40]))
    with pytest.raises(ValueError, match="renumber the ids below 2"):
        export_module(huge, k=2, filtered=True)


@pytest.mark.parametrize("spec", ["SQ8", "IVF8,SQ8", "IVF8(soar),Flat"])
def test_filtered_graph_of_sq_and_spilled_kinds(data, queries, spec):
    index = vq.index_factory(DIM, spec)
    x = torch.from_numpy(data)
    index.train(x)
    index.add_with_ids(x, torch.arange(len(x)) * 3 + 7)
    options = _nprobe(index)
    mask = _mask(index, 0.3, 4)
    D, I = export_module(index, k=6, filtered=True, **options)(
        torch.from_numpy(queries[:16]), torch.from_numpy(mask)
    )
    D_ref, I_ref = index.search(torch.from_numpy(queries[:16]), 6, allowed=mask, **options)
    assert_same_search(D, I, D_ref, I_ref)
    assert np.isin(I[I >= 0].numpy(), np.flatnonzero(mask)).all()


@pytest.mark.parametrize("desc", sorted(set(EXPORTED.values())))
def test_every_registered_kind_exports_its_filtered_torch_path_or_says_it_cannot(
    data, queries, desc
):
    """Every kind of the registry with a static search (tests/index_kinds.py, a toy kind
    included): the filtered graph gives the index's filtered torch path (every list probed),
    or the export refuses in words (a graph walk, whose filter lacks the exact fallback)."""
    x = torch.from_numpy(np.tile(data[:600], (1, 2)))  # (32 dimensions: every example fits)
    q = torch.from_numpy(np.tile(queries[:12], (1, 2)))
    index = vq.index_factory(x.shape[1], desc)
    index.train(x)
    index.add_with_ids(x, torch.arange(x.shape[0]) * 3 + 1)
    lists = [m.nlist for m in index.modules() if hasattr(m, "nlist")]
    options = {"nprobe": lists[0]} if lists else {}
    try:
        module = export_module(index, k=5, filtered=True, **options)
    except ValueError as err:
        assert "search graph takes no filter" in str(err)
        return
    mask = _mask(index, 0.3, 2)
    D, I = module(q, torch.from_numpy(mask))
    assert_same_search(D, I, *torch_path(index, "search", q, k=5, allowed=mask, **options))
    assert np.isin(I[I >= 0].numpy(), np.flatnonzero(mask)).all()
