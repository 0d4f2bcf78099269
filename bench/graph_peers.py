"""bench.frontier's graph peers from the registry: usearch (HNSW), NGT (ONNG) and Intel SVS
(Vamana). Each function builds one index with ``threads`` threads, L2, float32 vectors, and
returns its sweep (one batch search of all queries per point) and its bytes, in the shape of
bench.frontier's hnswlib_points; each raises ImportError, with the reason, where its library
does not import.

- usearch: ``Index(metric="l2sq", connectivity=M, expansion_add=200)``, ``threads=`` on add and
  search, swept over ``expansion_search``. Bytes: its serialized length (vectors, links, keys);
  its ``memory_usage`` also counts the arenas it reserves ahead (about 3x more at 5k vectors).
- NGT: an ANNG (edge_size_for_creation 100) reconstructed into an ONNG by ``ngtpy.Optimizer``
  (out-degree 10, in-degree 120, with NGT's shortcut reduction: ``ngt reconstruct-graph -m S``,
  ann-benchmarks' ONNG), swept over epsilon, with edge_size -2: the edges it follows at a node
  grow with epsilon (NGT's "dynamic edge size").
  ``batch_search`` takes no epsilon: it is set with ``Index.set``. NGT's threads are OpenMP ones
  of the libgomp its wheel bundles (not torch's or faiss's), limited through that library's own
  ``omp_set_num_threads``. Bytes: the saved ONNG folder.
- SVS: ``Vamana.build`` over float32 (alpha 1.2, build window 128 by default), ``num_threads``,
  swept over ``search_window_size``. Bytes: its saved config, graph and data. Its LVQ/LeanVec
  compression ends the process (exit code 1, "not supported on non-Intel hardware") on AMD
  CPUs rather than raising: :func:`svs_lvq_refusal` probes it in a child process.

The usearch and ngt wheels both export libstdc++ template instances (std::deque<bool> and others);
in a process where usearch's loads before NGT's (and before torch's or faiss's, whose copies then
win), NGT's ``batch_insert`` fails ("src/ngtpy.cpp:batchInsert:"), so :func:`_import_usearch`
loads ngtpy first where it is installed.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

K = 10
Search = Callable[[], np.ndarray]  # runs all queries, returns ids [nq, K]
Points = list[tuple[str, Search]]
Held = Callable[[], float] | None

#: epsilons of NGT's search (its "search range" coefficient: 0 is greedy, 0.1 explores widely)
NGT_EPSILONS = (0.0, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2)


def _import_usearch():
    """usearch.index, loaded after ngtpy where that is installed (see the module docstring)."""
    try:
        import ngtpy  # noqa: F401
    except ImportError:
        pass
    try:
        from usearch import index
    except ImportError as err:
        raise ImportError(f"usearch does not import: {err} (pip install usearch)") from err
    return index


def usearch_points(x, q, M: int, threads: int, efs) -> tuple[Points, Held]:
    """usearch HNSW, ``M`` links, expansion_add 200, swept over expansion_search."""
    index = _import_usearch().Index(
        ndim=x.shape[1], metric="l2sq", dtype="f32", connectivity=M, expansion_add=200
    )
    index.add(np.arange(len(x), dtype=np.uint64), x, threads=threads)

    def run(ef: int) -> Search:
        def search():
            index.expansion_search = max(ef, K)
            return index.search(q, K, threads=threads).keys

        return search

    return [(f"expansion_search={e}", run(e)) for e in efs], lambda: float(index.serialized_length)


def _limit_openmp(libs: Path, threads: int) -> None:
    """Set the thread count of each libgomp in a wheel's ``libs`` folder (auditwheel's
    ``<name>.libs``): the OpenMP runtime torch and faiss share is not that one."""
    for lib in sorted(libs.glob("libgomp*.so*")):
        ctypes.CDLL(str(lib)).omp_set_num_threads(threads)


def ngt_points(x, q, threads: int, epsilons=NGT_EPSILONS) -> tuple[Points, Held]:
    """NGT ONNG (ANNG edge 100, out 10, in 120, shortcut reduction), swept over epsilon."""
    try:
        import ngtpy
    except ImportError as err:
        raise ImportError(f"ngt does not import: {err} (pip install ngt)") from err
    _limit_openmp(Path(ngtpy.__file__).parent / "ngt.libs", threads)
    folder = tempfile.TemporaryDirectory(prefix="ngt-")
    anng, onng = f"{folder.name}/anng", f"{folder.name}/onng"
    ngtpy.create(anng, x.shape[1], edge_size_for_creation=100, distance_type="L2",
                 object_type="Float")  # fmt: skip
    built = ngtpy.Index(anng, log_disabled=True)
    built.batch_insert(x, num_threads=threads)
    built.save()
    built.close()
    optimizer = ngtpy.Optimizer(num_of_outgoings=10, num_of_incomings=120, log_disabled=True)
    optimizer.set_processing_modes(search_parameter_optimization=False,
                                   prefetch_parameter_optimization=False,
                                   accuracy_table_generation=False)  # fmt: skip
    optimizer.execute(anng, onng)
    index = ngtpy.Index(onng, read_only=True, log_disabled=True)

    def run(epsilon: float) -> Search:
        def search():
            index.set(epsilon=epsilon, edge_size=-2)
            results = ngtpy.BatchResults()
            index.batch_search(q, results, K, with_distance=False)
            return results.get_indexed_ids().reshape(len(q), K)

        return search

    def held(folder=folder) -> float:  # (the folder lives as long as this function)
        return float(sum(f.stat().st_size for f in Path(onng).rglob("*") if f.is_file()))

    return [(f"epsilon={e}", run(e)) for e in epsilons], held


def _import_svs():
    try:
        import svs
    except ImportError as err:
        raise ImportError(f"scalable-vs does not import: {err} (pip install scalable-vs)") from err
    return svs


def svs_points(x, q, R: int, threads: int, windows, window: int = 128) -> tuple[Points, Held]:
    """SVS Vamana over float32, graph_max_degree ``R``, build window ``window``, alpha 1.2,
    swept over search_window_size."""
    svs = _import_svs()
    parameters = svs.VamanaBuildParameters(graph_max_degree=R, window_size=window, alpha=1.2)
    index = svs.Vamana.build(parameters, x, svs.DistanceType.L2, num_threads=threads)
    index.num_threads = threads

    def run(w: int) -> Search:
        def search():
            index.search_window_size = max(w, K)
            return index.search(q, K)[0]

        return search

    def held() -> float:
        with tempfile.TemporaryDirectory(prefix="svs-") as tmp:
            index.save(f"{tmp}/config", f"{tmp}/graph", f"{tmp}/data")
            return float(sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file()))

    return [(f"search_window={w}", run(w)) for w in windows], held


_LVQ_PROBE = """
import numpy as np, svs, tempfile
x = np.random.default_rng(0).standard_normal((256, 16)).astype(np.float32)
with tempfile.TemporaryDirectory() as tmp:
    svs.write_vecs(x, tmp + "/x.fvecs")
    lvq = svs.LVQLoader(svs.VectorDataLoader(tmp + "/x.fvecs", svs.DataType.float32), 4, 8)
    svs.Vamana.build(svs.VamanaBuildParameters(graph_max_degree=8, window_size=16), lvq,
                     svs.DistanceType.L2)
"""


def svs_lvq_refusal() -> str | None:
    """Why SVS's LVQ compression cannot run here (what it printed as it ended a child process
    that built a tiny LVQ-4x8 index), or None where it builds."""
    _import_svs()
    done = subprocess.run([sys.executable, "-c", _LVQ_PROBE], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    if done.returncode == 0:
        return None
    lines = (done.stdout + done.stderr).strip().splitlines()
    return f"exit code {done.returncode}: {lines[-1] if lines else 'no message'}"
