"""Indexes from faiss-style description strings, and from saved configurations."""

from __future__ import annotations

import re

from vq.index.core.base import Index
from vq.index.core.registry import FactoryRefusal, kind, kinds
from vq.index.wrappers.refine import Refine
from vq.index.wrappers.transform import PreTransform
from vq.quantizers import OPQ, PCA

#: what the factory reads around the kinds' own descriptions
_AROUND = (
    "IVF<nlist>(soar[=<λ>]) for spilled lists, IVF<nlist>(spherical) for unit-norm centroids, "
    "IVF<nlist>_HNSW<M> for graph-routed lists, "
    "optionally preceded by OPQ<M>[_<dim_out>] or PCA<dim_out>, and before that by L2norm "
    "(vectors scaled to unit norm) and IDMap / IDMap2 (no-ops: every kind takes ids), "
    "and followed by RFlat or Refine(Flat), or Refine(SQfp16) (re-ranking on fp16 vectors) "
    "— e.g. 'PQ16', 'PQ16x8', 'IVF1024,Flat', 'IVF1024,PQ16', 'IVF1024,PQ32x4fs', "
    "'IVF1024,PQ32x4fsr', 'OPQ16,IVF1024,PQ16', 'OPQ16_64,IVF1024,PQ16,RFlat', "
    "'PCA128,IVF1024,Flat', 'PCA64,IVF1024,Flat,RFlat', "
    "'HNSW32,SQ8,Refine(SQfp16)'"
)


def supported() -> str:
    """What :func:`index_factory` reads: each registered kind's description, then the
    prefixes, transforms and re-rankings around them (its error messages list it)."""
    own = " | ".join(k.syntax for k in kinds() if k.syntax)
    return f"{own}, {_AROUND}"


# (re.ASCII: \d is 0-9 alone, not every script's digits, "IVF٤" included)
_OPQ = re.compile(r"OPQ(\d+)(?:_(\d+))?", re.ASCII)
# "PCA64": faiss's PCAMatrix to 64 dimensions (eigen power 0, no random rotation)
_PCA = re.compile(r"PCA(\d+)", re.ASCII)


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
        return ValueError(f"index_factory: {why}{where}; supported: {supported()}")

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

    index = _kind_index(parts, inner_dim, metric, fail)
    if opq is not None:
        index = PreTransform(opq, index)
    index = Refine(index, storage=refine) if refine else index
    index.normalize = index.normalize or l2norm  # (the outermost index: where vectors enter)
    return index


def _kind_index(parts: list[str], dim: int, metric: str, fail) -> Index:
    """The index of the registered kind whose description ``parts`` are."""
    text = ",".join(parts)
    for k in kinds():
        match = k.factory.fullmatch(text) if k.factory is not None else None
        if match is not None:
            try:
                return k.build(match, dim, metric)
            except FactoryRefusal as err:
                raise fail(str(err)) from None
    if len(parts) == 2 and any(k.family and k.family.fullmatch(parts[0]) for k in kinds()):
        raise fail(f"unknown encoding {parts[1]!r} after {parts[0]!r}")
    raise fail(f"cannot read {text!r}" if parts else "no index type")


#: the parts that may come first: faiss's IDMap / IDMap2 (no-ops here) and L2norm
_PREFIXES = ("IDMap", "IDMap2", "L2norm")


#: the re-ranking suffixes, and how each keeps the vectors
_REFINES = {"RFlat": "float32", "Refine(Flat)": "float32", "Refine(SQfp16)": "fp16"}


def index_classes() -> dict[str, type]:
    """The registered index kinds :func:`from_config` builds, by class name (the wrappers,
    PreTransform and Refine, aside)."""
    return {k.name: k.cls for k in kinds() if not k.wrapper}


def from_config(config: dict) -> Index:
    """An untrained index from ``{"class": name, **index.config()}`` (what ``save`` writes):
    the registered kind of that name builds it."""
    args = dict(config)
    name = args.pop("class", None)
    normalize = args.pop("normalize", False)  # ("L2norm," with l2, or before a wrapper)
    if not isinstance(normalize, bool):
        raise ValueError(f"invalid {name} configuration {config!r}: normalize must be a bool")
    found = kind(name)
    if found is None:
        known = ", ".join(k.name for k in kinds())
        raise ValueError(f"unknown index class {name!r}; known: {known}")
    try:
        index = found.config_index(args, from_config)
    except (KeyError, TypeError) as err:
        raise ValueError(f"invalid {name} configuration {config!r}: {err}") from err
    index.normalize = index.normalize or normalize
    return index
