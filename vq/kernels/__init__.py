"""Numba kernels: the CPU fast path.

They know nothing of quantizers or indexes: plain float32/int arrays in, results written into
caller-provided outputs. Every kernel releases the GIL (``nogil=True``) and compiles once per
machine: :mod:`vq.kernels.jit.cache` keeps them in the user's cache directory and loads them without
starting numba's compiler; kernels specialised by value (sub-vector size, number of tables, SIMD
variant) are the ``*_template`` modules, one cached source file per configuration.

- :mod:`vq.kernels.pq.coding`: exact arg-min, PQ encode/decode, additive decode, k-means++ steps.
- :mod:`vq.kernels.pq.adc`: look-up-table (ADC) scans of PQ codes fused with top-k, over a flat
  code array or CSR inverted lists, and the tables they read.
- :mod:`vq.kernels.exact.exact_scans`: exact-distance scans fused with top-k (re-ranking
  candidates, Flat blocks) and rows to ids; :mod:`vq.kernels.exact.ivf_flat`: IVF-Flat lists.
- :mod:`vq.kernels.exact.sketch`: 7-bit row sketches whose bounds let an IVF-Flat scan skip the
  exact distance of rows that cannot enter its top k (integer products by ``vpmaddubsw``).
- :mod:`vq.kernels.common.select`: the k nearest columns of rows of inner products (coarse steps).
- :mod:`vq.kernels.fastscan.fastscan_scans`, :mod:`vq.kernels.fastscan.fastscan_ivf`: 4-bit
  fast-scan (byte-shuffle look-ups of uint8 tables), flat and over inverted lists;
  :mod:`vq.kernels.fastscan.fastscan_pack` packs inverted lists into its blocks (only the
  lists that changed).
- :mod:`vq.kernels.common.rows`: stored rows moved in place (add, remove_ids, merge_from).
- :mod:`vq.kernels.common.simd`: 16-float vector helpers (LLVM intrinsics) the kernels share, and
  ``fetch_add``, the atomic counter from which a split search's threads claim queries.
- :mod:`vq.kernels.exact.lean_scans`: the lean path of a few queries (flat rows, IVF-Flat), on
  the calling thread; :mod:`vq.kernels.exact.coarse_probe`: its coarse step.
- :mod:`vq.kernels.common.bundles`: the named tuples the kernels take (the coarse quantizer,
  the inverted lists of each kind, the tables, the outputs).
- :mod:`vq.kernels.common.heaps`: float and int64-key heaps, and the keys that order ties by row.
- :mod:`vq.kernels.graph.graph_search`, :mod:`vq.kernels.graph.graph_build`: HNSW search (on
  the vectors or on int8 codes) and batched parallel construction.
- :mod:`vq.kernels.common.threads`: the thread pool the kernels run on.
- :mod:`vq.kernels.jit.numba_compat`: every use of numba's internals (the kernels' dispatcher
  and cache objects, the inliner's copy of a callee's scope), checked against a range of numba
  releases.
"""

from vq.kernels.common.select import smallest_k_rows, unique_rows
from vq.kernels.exact.coarse_probe import column_panels, probe_lists
from vq.kernels.exact.exact_scans import (
    heap_push_block,
    heaps_sorted,
    refine_lean,
    refine_range,
    refine_scan,
    rows_to_ids,
)
from vq.kernels.exact.ivf_flat import ivf_flat_range, ivf_flat_scan
from vq.kernels.exact.lean_scans import (
    all_finite,
    flat_finish,
    flat_lean,
    flat_parts,
    flat_rows,
    ivf_flat_lean,
    nearest_lean,
)
from vq.kernels.exact.range_scans import flat_range_block, ivf_flat_range_search
from vq.kernels.pq.adc import (
    IP_TABLE,
    L2_TABLE,
    RESIDUAL_L2_TABLE,
    adc_scanner,
    code_view,
    ivfpq_hits,
    ivfpq_lean,
    ivfpq_scanner,
    pq_lean,
    words_layout,
)
from vq.kernels.pq.coding import (
    ASSIGN_BLOCK,
    additive_decode,
    argmin_ahead,
    argmin_rows,
    assign_accumulate,
    kmeanspp_pick,
    kmeanspp_sample,
    pq_decoder,
    pq_encoder,
    pq_encoder_ahead,
    pq_encoder_lean,
    spill_argmin_rows,
)

__all__ = [
    "ASSIGN_BLOCK",
    "assign_accumulate",
    "IP_TABLE",
    "L2_TABLE",
    "RESIDUAL_L2_TABLE",
    "adc_scanner",
    "all_finite",
    "code_view",
    "heap_push_block",
    "heaps_sorted",
    "additive_decode",
    "argmin_ahead",
    "argmin_rows",
    "ivf_flat_lean",
    "ivf_flat_scan",
    "flat_finish",
    "flat_lean",
    "flat_parts",
    "flat_range_block",
    "flat_rows",
    "ivf_flat_range",
    "ivf_flat_range_search",
    "ivfpq_hits",
    "ivfpq_scanner",
    "ivfpq_lean",
    "probe_lists",
    "column_panels",
    "refine_lean",
    "refine_range",
    "kmeanspp_pick",
    "kmeanspp_sample",
    "nearest_lean",
    "pq_decoder",
    "pq_encoder",
    "pq_encoder_ahead",
    "pq_encoder_lean",
    "pq_lean",
    "refine_scan",
    "rows_to_ids",
    "smallest_k_rows",
    "spill_argmin_rows",
    "unique_rows",
    "words_layout",
]
