"""Indexes from faiss-style description strings, and from saved configurations."""

from __future__ import annotations

import re

from vq.index.core.base import Index
from vq.index.flat.flat_index import FlatIndex
from vq.index.flat.pq_index import PQIndex
from vq.index.flat.sq_index import SQIndex
from vq.index.graph.hnsw import HNSW
from vq.index.graph.hnsw_sq import HNSWSQ
from vq.index.ivf.ivfflat import IVFFlat
from vq.index.ivf.ivfpq import IVFPQ
from vq.index.ivf.ivfsq import IVFSQ
from vq.index.wrappers.refine import Refine
from vq.index.wrappers.transform import PreTransform
from vq.quantizers import OPQ, PCA

SUPPORTED = (
    "Flat | PQ<M>[x<nbits>] | PQ<M>x4fs | SQ8|SQ6|SQ4|SQfp16|SQbf16 | "
    "HNSW<M>[,Flat|,SQ8|,SQ6|,SQ4|,SQfp16|,SQbf16] | "
    "IVF<nlist>,Flat[(sketch)] | IVF<nlist>,PQ<M>[x<nbits>|x4fs|x4fsr] | "
    "IVF<nlist>,SQ<8|6|4|fp16|bf16>, "
    "IVF<nlist>(soar[=<λ>]) for spilled lists, IVF<nlist>_HNSW<M> for graph-routed lists, "
    "optionally preceded by OPQ<M>[_<dim_out>] or PCA<dim_out>, and before that by L2norm "
    "(vectors scaled to unit norm) and IDMap / IDMap2 (no-ops: every kind takes ids), "
    "and followed by RFlat or Refine(Flat), or Refine(SQfp16) (re-ranking on fp16 vectors) "
    "— e.g. 'PQ16', 'PQ16x8', 'IVF1024,Flat', 'IVF1024,PQ16', 'IVF1024,PQ32x4fs', "
    "'IVF1024,PQ32x4fsr', 'OPQ16,IVF1024,PQ16', 'OPQ16_64,IVF1024,PQ16,RFlat', "
    "'PCA128,IVF1024,Flat', 'PCA64,IVF1024,Flat,RFlat', "
    "'HNSW32,SQ8,Refine(SQfp16)'"
)

# (re.ASCII: \d is 0-9 alone, not every script's digits, "IVF٤" included)
_OPQ = re.compile(r"OPQ(\d+)(?:_(\d+))?", re.ASCII)
# "PCA64": faiss's PCAMatrix to 64 dimensions (eigen power 0, no random rotation)
_PCA = re.compile(r"PCA(\d+)", re.ASCII)
# "np" (no polysemous training) is a no-op here; "x4fs" is 4-bit fast-scan, which in an IVF
# encodes the vectors themselves unless "x4fsr" asks for residuals (faiss's defaults)
_PQ = re.compile(r"PQ(\d+)(?:x(\d+)(fsr?)?)?(?:np)?", re.ASCII)
# "IVF1024(soar)" / "IVF1024(soar=0.5)": spilled lists (SOAR, λ 1 unless given);
# "IVF65536_HNSW32": the coarse quantizer routed by an HNSW graph over the centroids
_IVF = re.compile(r"IVF(\d+)(?:_HNSW(\d+))?(?:\((soar)(?:=(\d+(?:\.\d*)?))?\))?", re.ASCII)
_SQ = re.compile(r"SQ(8|6|4|fp16|bf16)")
_HNSW = re.compile(r"HNSW(\d+)", re.ASCII)


def _sq_bits(match: re.Match) -> int | str:
    return match[1] if match[1].startswith(("fp", "bf")) else int(match[1])


def index_factory(dim: int, description: str, metric: str = "l2") -> Index:
    """An untrained index described as faiss's ``index_factory`` would describe it.

    Args:
        dim: vector dimension.
        description: comma-separated parts, e.g. ``"OPQ16_64,IVF1024,PQ16,RFlat"``: an optional
            OPQ rotation (to ``dim_out`` dimensions), then Flat / PQ / IVF + Flat / IVF + PQ,
            then an optional exact re-ranking (``RFlat`` or ``Refine(Flat)``, k_factor 1 as in
            faiss; set ``index.k_factor``). ``IVF<nlist>(soar)`` (or ``(soar=<λ>)``) spills
            each vector into a second list (SOAR; see :class:`vq.index.IVFIndex`), a vq
            extension faiss does not read. ``PQ<M>x4fs`` is 4-bit fast-scan; after an IVF it
            encodes the vectors themselves, ``x4fsr`` their residuals (as in faiss).
            ``IVF<nlist>,Flat(sketch)`` keeps sketches that spare the CPU scans most exact
            distances (``IVFFlat(sketch=True)``), another vq extension. faiss's prefixes
            ``IDMap,`` and ``IDMap2,`` are read and do nothing (every vq index takes
            ``add_with_ids``), and ``L2norm,`` scales vectors and queries to unit norm where
            they enter the index (before an OPQ / PCA that follows; with metric "ip" that is
            metric "cosine").
        metric: "l2", "ip" or "cosine" (see :class:`vq.index.Index`).

    Raises:
        ValueError: for a part it does not understand, listing what is supported, or a number
            out of its range (the constructor's words, naming the argument and the range).
        TypeError: an argument of the wrong type (``dim``, ``metric``).
    """
    try:
        return _build(dim, str(description), metric)
    except (ValueError, TypeError) as err:
        if str(err).startswith("index_factory:"):
            raise
        raise type(err)(f"index_factory: {err} (in {str(description)!r})") from err


def _build(dim: int, description: str, metric: str) -> Index:
    parts = [p.strip() for p in description.split(",")]

    def fail(why: str) -> ValueError:
        where = "" if repr(description) in why else f" in {description!r}"
        return ValueError(f"index_factory: {why}{where}; supported: {SUPPORTED}")

    l2norm = False
    while parts and parts[0] in _PREFIXES:
        l2norm = l2norm or parts[0] == "L2norm"
        parts = parts[1:]
    opq: OPQ | PCA | None = None
    if parts and (m := _OPQ.fullmatch(parts[0])):
        M, dim_out = int(m[1]), int(m[2] or dim)
        opq = OPQ(dim, M, dim_out=dim_out)
        parts = parts[1:]
    elif parts and (m := _PCA.fullmatch(parts[0])):
        if not 0 < int(m[1]) <= dim:
            raise fail(f"PCA{m[1]}: the output dimension must lie in [1, {dim}]")
        opq = PCA(dim, int(m[1]))
        parts = parts[1:]
    if parts and parts[0] in _PREFIXES:
        raise fail(f"{parts[0]} after a transform (it comes first: 'L2norm,PCA64,…')")
    refine = _REFINES.get(parts[-1]) if parts else None
    if refine:
        parts = parts[:-1]
    inner_dim = opq.dim_out if opq is not None else dim

    if parts == ["Flat"]:
        index: Index = FlatIndex(inner_dim, metric)
    elif parts and (m := _HNSW.fullmatch(parts[0])) and parts[1:] in ([], ["Flat"]):
        index = HNSW(inner_dim, int(m[1]), metric)
    elif len(parts) == 2 and (m := _HNSW.fullmatch(parts[0])) and (s := _SQ.fullmatch(parts[1])):
        index = HNSWSQ(inner_dim, int(m[1]), _sq_bits(s), metric)
    elif len(parts) == 1 and (m := _SQ.fullmatch(parts[0])):
        index = SQIndex(inner_dim, _sq_bits(m), metric)
    elif len(parts) == 1 and (m := _PQ.fullmatch(parts[0])) and m[3] != "fsr":
        index = PQIndex(inner_dim, int(m[1]), int(m[2] or 8), metric, fast_scan=bool(m[3]))
    elif len(parts) == 2 and (ivf := _IVF.fullmatch(parts[0])):
        nlist = int(ivf[1])
        if ivf[2] is not None and int(ivf[2]) < 2:
            raise fail(f"_HNSW{ivf[2]}: the graph's M must be >= 2")
        extra = {"coarse_hnsw": int(ivf[2])} if ivf[2] else {}
        if ivf[3]:
            extra.update(spill=True, soar_lambda=float(ivf[4] or 1.0))
        if parts[1] in ("Flat", "Flat(sketch)"):
            index = IVFFlat(inner_dim, nlist, metric, sketch=parts[1] != "Flat", **extra)
        elif m := _PQ.fullmatch(parts[1]):
            M, nbits, fs = int(m[1]), int(m[2] or 8), bool(m[3])
            residual = m[3] != "fs"  # IndexIVFPQFastScan encodes residuals only with "x4fsr"
            index = IVFPQ(
                inner_dim, nlist, M, nbits, residual, metric=metric, fast_scan=fs, **extra
            )
        elif m := _SQ.fullmatch(parts[1]):
            index = IVFSQ(inner_dim, nlist, _sq_bits(m), metric=metric, **extra)
        else:
            raise fail(f"unknown encoding {parts[1]!r} after {parts[0]!r}")
    else:
        raise fail(f"cannot read {','.join(parts)!r}" if parts else "no index type")
    if opq is not None:
        index = PreTransform(opq, index)
    index = Refine(index, storage=refine) if refine else index
    index.normalize = index.normalize or l2norm  # (the outermost index: where vectors enter)
    return index


#: the parts that may come first: faiss's IDMap / IDMap2 (no-ops here) and L2norm
_PREFIXES = ("IDMap", "IDMap2", "L2norm")


#: the re-ranking suffixes, and how each keeps the vectors
_REFINES = {"RFlat": "float32", "Refine(Flat)": "float32", "Refine(SQfp16)": "fp16"}

_CLASSES = {
    cls.__name__: cls for cls in (FlatIndex, PQIndex, IVFFlat, IVFPQ, SQIndex, IVFSQ, HNSW, HNSWSQ)
}


def index_classes() -> dict[str, type]:
    """The index kinds :func:`from_config` builds, by class name (the wrappers, PreTransform
    and Refine, aside)."""
    return dict(_CLASSES)


def from_config(config: dict) -> Index:
    """An untrained index from ``{"class": name, **index.config()}`` (what ``save`` writes)."""
    args = dict(config)
    name = args.pop("class", None)
    normalize = args.pop("normalize", False)  # ("L2norm," with l2, or before a wrapper)
    if not isinstance(normalize, bool):
        raise ValueError(f"invalid {name} configuration {config!r}: normalize must be a bool")
    index = _from_args(name, args, config)
    index.normalize = index.normalize or normalize
    return index


def _from_args(name, args: dict, config: dict) -> Index:
    try:
        if name == "PreTransform":
            t = dict(args["transform"])
            if t.pop("kind", "opq") == "pca":
                transform: OPQ | PCA = PCA(t.pop("dim"), **t)
            else:
                transform = OPQ(t.pop("dim"), t.pop("M"), t.pop("nbits"), **t)
            return PreTransform(transform, from_config(args["index"]), k=args.get("k"))
        if name == "Refine":
            inner = from_config(args["index"])
            storage = args.get("storage", "float32")  # (files before fp16 storage: float32)
            return Refine(inner, args["k_factor"], k=args.get("k"), storage=storage)
        if name in _CLASSES:
            return _CLASSES[name](**args)
    except (KeyError, TypeError) as err:
        raise ValueError(f"invalid {name} configuration {config!r}: {err}") from err
    raise ValueError(
        f"unknown index class {name!r}; known: {', '.join([*_CLASSES, 'PreTransform', 'Refine'])}"
    )
