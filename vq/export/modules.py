"""``export_module``: the static-shape graph of a quantizer's encode/decode or an index's search."""

from __future__ import annotations

import torch

from vq.export.base import ExportModule
from vq.export.codecs import codec_module
from vq.export.search import search_module
from vq.index import IVFPQ, PQIndex
from vq.index.core.base import Index
from vq.quantizers import Quantizer

WHATS = ("encode", "decode", "search")
_CODE_DTYPES = (torch.uint8, torch.int16, torch.int32, torch.int64)


def export_module(
    obj: Quantizer | Index,
    what: str | None = None,
    *,
    k: int | None = None,
    nprobe: int | None = None,
    k_factor: int | None = None,
    capacity: int | None = None,
    code_dtype: torch.dtype | str | None = None,
    filtered: bool = False,
) -> ExportModule:
    """A ``torch.nn.Module`` computing ``what`` for ``obj`` with static shapes.

    Its constants are copied from ``obj`` now: later training, ``add`` or ``remove_ids`` do not
    reach it. It runs in torch eager mode, compiles with ``torch.compile(fullgraph=True,
    dynamic=False)``, exports with strict ``torch.export.export`` and ``torch.onnx.export``,
    and traces with ``torch.jit.trace``; it lives on ``obj``'s device (``.to()`` moves it).

    Args:
        obj: a trained :class:`vq.VectorQuantizer`, :class:`vq.ResidualVQ` (greedy or beam),
            :class:`vq.GroupedResidualVQ`, :class:`vq.ProductQuantizer`, :class:`vq.OPQ`,
            :class:`vq.FSQ`, :class:`vq.ResidualFSQ`, :class:`vq.LFQ` or
            :class:`vq.ResidualLFQ`, with any layer
            option (see :mod:`vq.export.codecs`); or a trained, non-empty
            :class:`vq.FlatIndex`, :class:`vq.PQIndex`, :class:`vq.IVFFlat`, :class:`vq.IVFPQ`,
            or :class:`vq.PreTransform` / :class:`vq.Refine` around them (faiss indexes
            imported with :func:`vq.index.from_faiss` included).
        what: "encode" (vectors float32 [B, dim] → codes [B, *code_shape]) or "decode" (codes
            → vectors) for quantizers, default "encode"; "search" (queries float32 [B, dim] →
            distances float32 [B, k], ids int64 [B, k]) for indexes, the default there.
        k: neighbours per query (search; default the index's ``k``).
        nprobe: inverted lists probed (IVF search; default the index's ``nprobe``).
        k_factor: re-ranking candidates per result (Refine; default the index's).
        capacity: slots per padded inverted list (IVF; default and minimum: the longest list).
        code_dtype: integer dtype of the codes: the encode output, the decode input, or the
            code tables inside a PQIndex / IVFPQ search graph; default the quantizer's
            ``code_dtype`` (uint8 up to 256 codewords). ``"int32"`` suits runtimes that take
            uint8 for inputs and outputs only (TensorRT).
        filtered: search only: a second input ``allowed`` bool [id_space], one mask over
            the ids per call; ids it marks False are never returned (see
            :func:`vq.export.search.search_module`).

    Raises:
        TypeError: ``obj`` is not a supported quantizer or index.
        ValueError: an untrained quantizer or index, an empty index, an unknown ``what``, an
            option that does not apply, or a bad value.
    """
    if what is not None and what not in WHATS:
        raise ValueError(f"what must be one of {WHATS}, got {what!r}")
    if isinstance(obj, Index):
        module = _search_module(obj, what, k, nprobe, k_factor, capacity, code_dtype, filtered)
    elif isinstance(obj, Quantizer):
        if filtered:
            raise ValueError(
                f"filtered applies to the search of an index, not to a {type(obj).__name__}"
            )
        module = _codec_module(obj, what, k, nprobe, k_factor, capacity, code_dtype)
    else:
        raise TypeError(
            f"export_module: expected a vq quantizer or index, got {type(obj).__name__}"
        )
    module.metadata["what"] = what or ("search" if isinstance(obj, Index) else "encode")
    module.metadata["source"] = type(obj).__name__
    return module.eval()


def _search_module(
    index, what, k, nprobe, k_factor, capacity, code_dtype, filtered=False
) -> ExportModule:
    name = type(index).__name__
    if what not in (None, "search"):
        raise ValueError(
            f"an index exports what='search'; for {what} export its quantizer "
            f"(e.g. index.pq) instead of the {name}"
        )
    if code_dtype is not None:
        holder = next((m for m in index.modules() if isinstance(m, PQIndex | IVFPQ)), None)
        if holder is None:
            raise ValueError(
                f"code_dtype applies to encode/decode and to indexes storing PQ codes, not to a "
                f"{name}"
            )
        code_dtype = _code_dtype(code_dtype, holder.pq)
    if not index.is_trained:
        raise ValueError(f"the {name} is not trained; call train(x) and add(x) before exporting")
    if index.ntotal == 0:
        raise ValueError(f"the {name} is empty; add vectors before exporting its search")
    if nprobe is not None and not any(hasattr(m, "nlist") for m in index.modules()):
        raise ValueError(f"nprobe applies to IVF indexes, not to a {name}")
    if k_factor is not None and not hasattr(index, "k_factor"):
        raise ValueError(f"k_factor applies to Refine, not to a {name}")
    if capacity is not None and not any(hasattr(m, "nlist") for m in index.modules()):
        raise ValueError(f"capacity applies to IVF indexes, not to a {name}")
    with torch.no_grad():
        return search_module(
            index, index.k if k is None else k, nprobe, k_factor, capacity, code_dtype, filtered
        )


def _codec_module(quantizer, what, k, nprobe, k_factor, capacity, code_dtype) -> ExportModule:
    name = type(quantizer).__name__
    if what == "search":
        raise ValueError(
            f"a {name} exports what='encode' or 'decode'; search needs an index (vq.PQIndex, "
            "vq.IVFPQ, …)"
        )
    given = {"k": k, "nprobe": nprobe, "k_factor": k_factor, "capacity": capacity}
    extra = [key for key, value in given.items() if value is not None]
    if extra:
        raise ValueError(f"{', '.join(extra)} apply to what='search' of an index, not to a {name}")
    if not quantizer.is_trained:
        raise ValueError(
            f"the {name} is not trained; call fit(x) before exporting (a learning layer also "
            "trains in its first training-mode forward)"
        )
    dtype = _code_dtype(code_dtype, quantizer)
    with torch.no_grad():
        return codec_module(quantizer, what or "encode", dtype)


def _code_dtype(code_dtype, quantizer) -> torch.dtype | None:
    if code_dtype is None:
        return None
    dtype = getattr(torch, code_dtype, None) if isinstance(code_dtype, str) else code_dtype
    if dtype not in _CODE_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in _CODE_DTYPES)
        raise ValueError(f"code_dtype must be one of {names}, got {code_dtype!r}")
    if quantizer.codebook_size - 1 > (torch.iinfo(dtype).max):
        raise ValueError(
            f"code_dtype {str(dtype).removeprefix('torch.')} cannot hold codes up to "
            f"{quantizer.codebook_size - 1}; use a wider integer type"
        )
    return dtype
