"""Index.nbytes: the memory an index holds, buffers and search caches, each region once."""

import functools

import numpy as np
import pytest
import torch

import vq
from vq.index.core.memory import held_bytes


def _buffer_bytes(module) -> int:
    return sum(t.untyped_storage().nbytes() for t in module.buffers())


def _vectors(n=4096, d=32, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def test_a_flat_index_holds_its_vectors_and_nothing_more_before_a_search():
    x = _vectors()
    index = vq.index_factory(32, "Flat")
    index.add(x)
    assert index.nbytes() == x.nbytes  # sequential ids are implicit: no id buffer


def test_a_fast_scan_index_holds_its_codes_once_as_blocks_before_and_after_a_search():
    x = _vectors()
    index = vq.index_factory(32, "PQ16x4fs")
    index.train(x)
    index.add(x)
    before = index.nbytes()
    assert 0 <= before - _buffer_bytes(index) <= 64
    packed = x.shape[0] * 16 // 2  # two codes a byte, 4096 rows: whole blocks of 32
    assert index.packed_codes.numel() == packed
    assert before <= packed + 16 * 16 * 2 * 4 + 256  # + the codebooks and small buffers
    assert index.codes.shape == (x.shape[0], 16)  # (unpacked on demand, not held)
    assert index.nbytes() == before
    index.search(x[:64], 10)
    grown = index.nbytes() - before
    assert 0 <= grown <= 4096  # the codebook tables the scan reads; no second copy of codes
    index.search(x[:64], 10)
    assert index.nbytes() - before == grown  # kept, not rebuilt


def test_views_and_copies_of_the_same_memory_count_once():
    t = torch.zeros(1000, dtype=torch.float32)
    a = t.numpy()
    module = torch.nn.Module()
    module.register_buffer("t", t)
    module.register_buffer("tail", t[500:])  # a view: inside t's storage
    module.cache = (a[:10], {"again": a}, functools.partial(print, a[::2]))
    assert held_bytes(module) == 4000
    module.extra = np.ones(10, np.int64)
    assert held_bytes(module) == 4080


def test_arrays_held_by_a_closure_are_counted():
    module = torch.nn.Module()
    data = np.zeros(256, np.uint8)
    module.search = lambda: data.sum()
    assert held_bytes(module) == 256


def test_a_spilled_index_with_fp16_refinement_counts_each_part():
    x = _vectors(2048, 32)  # (test_refine_fp16's dim and M: the same compiled kernels)
    index = vq.index_factory(32, "IVF16(soar),PQ16x4fs,Refine(SQfp16)")
    index.train(x)
    index.add(x)
    inner = index.index
    packed = inner.packed_codes.numel()  # two codes a byte; each list padded to whole blocks
    assert 2 * 2048 * 16 // 2 <= packed <= (2 * 2048 + 16 * 31) * 16 // 2
    stored = 2048 * 32 * 2 + inner.ids.numel() * 8 + packed  # fp16, ids, codes
    assert inner.ids.numel() == 2 * 2048  # each vector in two lists
    assert index.vectors.dtype == torch.float16
    assert 0 <= index.nbytes() - _buffer_bytes(index) <= 400  # (+ list_blocks, derived)
    stored += 16 * 32 * 4 + 16 * 16 * 2 * 4  # coarse centroids, PQ codebooks
    assert stored <= index.nbytes() <= stored + 1024  # + list offsets
    index.search(x[:8], 10, nprobe=4, k_factor=2)
    assert index.nbytes() - stored <= 8192  # tables, norms: no second copy of the codes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_buffers_are_counted_apart_from_host_arrays():
    module = torch.nn.Module()
    module.register_buffer("gpu", torch.zeros(100, device="cuda"))
    module.host = np.zeros(100, np.float32)
    assert held_bytes(module) == 800
