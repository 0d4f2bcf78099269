"""A compat layer's vq layer, built to learn and to start as the anchor's does: the learning
rule and quantizer dropout of the anchor's arguments, and the anchor's random draws (codebooks,
projections) from the global generator in the anchor's order.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from vq.quantizers import EMA, Gradient, GroupedResidualVQ, Learning, ResidualVQ, VectorQuantizer


def dead_code_ratios(owner: str, codebook_size: int, **dead) -> tuple[float, float | None]:
    """The anchor's dead-code arguments (version 1.34: ``dead_code_threshold_ratio``,
    ``reset_cluster_size_ratio`` and the deprecated ``threshold_ema_dead_code``,
    ``reset_cluster_size``) → ``(dead_code_ratio, reset_ratio)`` of :class:`vq.Learning`. The
    deprecated ones convert as the anchor converts them, with its warning: a value ``v >= 1``
    becomes ``v / codebook_size``, a smaller one is taken as the ratio."""
    ratio, reset = dead["dead_code_threshold_ratio"], dead["reset_cluster_size_ratio"]
    for old, new in (
        ("threshold_ema_dead_code", "dead_code_threshold_ratio"),
        ("reset_cluster_size", "reset_cluster_size_ratio"),
    ):
        value = dead[old]
        if value is None:
            continue
        if not value >= 0:  # (NaN too)
            raise ValueError(
                f"{owner}: {old} must be >= 0 (an average code usage; 0 disables the restarts), "
                f"got {value}; it is deprecated in vector-quantize-pytorch 1.34: pass {new} (a "
                "fraction in [0, 1) of the mean code usage, e.g. 0.1) instead"
            )
        converted = value / codebook_size if value >= 1 else value
        warnings.warn(
            f"{owner}: {old} is deprecated in vector-quantize-pytorch 1.34; pass {new} (a "
            f"fraction in [0, 1) of the mean code usage, e.g. 0.1) instead. {old}={value} is "
            f"taken as {new}={converted}",
            DeprecationWarning,
            stacklevel=3,  # the caller of the compat class
        )
        if old == "threshold_ema_dead_code":
            ratio = converted
        else:
            reset = converted
    if not 0.0 <= ratio < 1.0:
        raise ValueError(
            f"{owner}: dead_code_threshold_ratio must lie in [0, 1) (a fraction of the mean code "
            f"usage; 0 disables dead-code restarts), got {ratio}"
        )
    return float(ratio), None if reset is None or ratio == 0 else float(reset)


def learning_rule(
    owner: str,
    *,
    decay: float,
    eps: float,
    kmeans_init: bool,
    kmeans_iters: int,
    dead_code: tuple[float, float | None],
    commitment_weight: float,
    use_cosine_sim: bool,
    ema_update: bool | None,
    learnable_codebook: bool | None,
) -> Learning:
    """vector-quantize-pytorch's codebook update (version 1.34) as a vq rule: EMA
    (``ema_update``, the default) with its decay and ε (``smoothing="codeword"``, statistics
    from zero), or gradient learning (``learnable_codebook=True, ema_update=False``: the
    codebook loss weighs ``commitment_weight``, as the anchor's undetached commitment does);
    random start unless ``kmeans_init``; dead codes restarted below ``dead_code`` (the
    :func:`dead_code_ratios` pair) of the mean usage (the usage average decays with ``decay``
    either way)."""
    ema = True if ema_update is None else bool(ema_update)
    learnable = bool(learnable_codebook)
    ratio, reset = dead_code
    common = dict(
        kmeans_init=bool(kmeans_init),
        kmeans_iters=int(kmeans_iters),
        dead_code_ratio=ratio,
        reset_ratio=reset,
    )
    if ema and learnable:
        raise ValueError(
            f"{owner}: learnable_codebook=True learns the codebook by gradient; pass "
            "ema_update=False with it (vector-quantize-pytorch refuses both at once too)"
        )
    if ema:
        return EMA(decay=decay, eps=eps, smoothing="codeword", **common)
    if not learnable:
        raise ValueError(
            f"{owner}: ema_update=False without learnable_codebook=True leaves the codebook at "
            "its random start, which vq has no layer for; pass learnable_codebook=True to learn "
            "it by gradient"
        )
    if use_cosine_sim:
        raise ValueError(
            f"{owner}: use_cosine_sim=True with learnable_codebook=True: vector-quantize-pytorch "
            "refuses it too (cosine codebooks learn by EMA)"
        )
    return Gradient(codebook_weight=commitment_weight, usage_decay=decay, **common)


def dropout_options(quantize_dropout: bool, cutoff: int, num_quantizers: int) -> dict:
    """vq's quantizer-dropout options for the anchor's: each training sample keeps n stages,
    n uniform in [cutoff + 1, Q]."""
    if not quantize_dropout or num_quantizers == 1:
        return {}
    if not 0 <= cutoff < num_quantizers:
        raise ValueError(
            f"quantize_dropout_cutoff_index must lie in [0, {num_quantizers - 1}], got {cutoff}"
        )
    return dict(quantizer_dropout=1.0, dropout_min_stages=cutoff + 1)


@contextmanager
def own_draws():
    """Build a vq layer without drawing from the global generator (its random start is then
    redrawn in the anchor's order: :func:`anchor_codebooks`, ``reset_parameters``)."""
    with torch.random.fork_rng(devices=[]):
        yield


def anchor_codebooks(draws: int, per_draw: int, size: int, dim: int, cosine: bool):
    """vector-quantize-pytorch's random codebooks: ``draws`` kaiming-uniform draws of
    ``[per_draw, size, dim]`` (bound √(6 / (size · dim))) from the global generator, in its
    order, l2-normalised for cosine codebooks → float32 Tensor[draws · per_draw, size, dim]."""
    books = []
    for _ in range(draws):
        book = torch.empty(per_draw, size, dim)
        nn.init.kaiming_uniform_(book)
        books.append(F.normalize(book, dim=-1, eps=1e-6) if cosine else book)
    return torch.cat(books)


def start_from(layer: VectorQuantizer | ResidualVQ | GroupedResidualVQ, books: torch.Tensor):
    """Write ``books`` [G, K, d] (in the order of ``layer.effective_codebooks()``) into a
    learning layer's codebooks, with the anchor's usage statistics (zero counts and sums)."""
    stacks = list(layer.rvqs) if isinstance(layer, GroupedResidualVQ) else [layer]
    for stack, part in zip(stacks, books.chunk(len(stacks)), strict=True):
        storage = stack.codebook[None] if isinstance(stack, VectorQuantizer) else stack.codebooks
        with torch.no_grad():
            storage.copy_(part)
        stack.learner.reset_(storage.detach(), torch.zeros(part.shape[:2]))


def redraw_projections(layer: nn.Module) -> None:
    """Redraw a vq layer's ``project_in`` then ``project_out`` (when it has them) from the
    global generator, as the anchor's constructor draws its projections."""
    for name in ("project_in", "project_out"):
        linear = getattr(layer, name)
        if linear is not None:
            linear.reset_parameters()
