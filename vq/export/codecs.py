"""Encode and decode graphs: a quantizer's own ``static_encode`` / ``static_decode`` (next to
each quantizer class, the functions its ``encode`` / ``decode`` run off the numba path), on a
snapshot of the quantizer, with the specs and metadata of an exported model.

Every layer option exports with it: ``codebook_dim`` (``project_in`` / ``project_out``),
``cosine`` (l2-normalisation), residual stages with greedy or beam-search encoding (grouped
too), FSQ's grid and projections, LFQ's sign bits, residual FSQ/LFQ stages, codebooks learned
by EMA, by gradient or by SimVQ (the learned map of the frozen codebook: the
graph reads :meth:`~vq.quantizers.layer.TrainingLayer.effective_codebooks`), cosine residual
stages. Options that act on training only (``commitment_weight``,
``rotation_trick``, ``quantizer_dropout``, masks, LFQ's entropy loss) leave the graph as eval
mode has it; ``channel_first`` layers export ``encode`` / ``decode``, which take ``[..., dim]``.
"""

from __future__ import annotations

import torch

from vq.export.base import ExportModule, Method, TensorSpec, snapshot
from vq.quantizers import Quantizer


def codec_module(
    quantizer: Quantizer, what: str, code_dtype: torch.dtype | None = None
) -> ExportModule:
    """The ``what`` ("encode": vectors float32 [B, dim] → codes [B, *code_shape]; "decode":
    the reverse) graph of a trained quantizer, codes of ``code_dtype`` (default the
    quantizer's)."""
    method = "static_decode" if what == "decode" else "static_encode"
    if not hasattr(quantizer, method):
        raise TypeError(
            f"no {what} graph for {type(quantizer).__name__}: it has no {method}; export a "
            "vq.VectorQuantizer, ProductQuantizer, OPQ, ResidualVQ, GroupedResidualVQ, FSQ, "
            "ResidualFSQ, LFQ or ResidualLFQ"
        )
    dtype = quantizer.code_dtype if code_dtype is None else code_dtype
    vectors = TensorSpec("vectors", torch.float32, (quantizer.dim,))
    codes = TensorSpec("codes", dtype, tuple(quantizer.code_shape))
    inputs, outputs = ((codes,), (vectors,)) if what == "decode" else ((vectors,), (codes,))
    metadata = {
        "dim": str(quantizer.dim),
        "codebook_size": str(quantizer.codebook_size),
        "code_shape": ",".join(map(str, quantizer.code_shape)),
        "code_dtype": str(dtype).removeprefix("torch."),
    }
    if hasattr(quantizer, "beam_size"):
        metadata["beam_size"] = str(quantizer.beam_size)
    return ExportModule(Method(snapshot(quantizer), method), inputs, outputs, metadata)
