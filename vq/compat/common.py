"""What the compat layers share: argument checks, the anchor's starting codebooks, and the
per-stage outputs of residual layers (codes with -1 for dropped stages, a loss per stage).

Arguments vq honours are explicit keyword arguments of each compat class; every other argument
of vector-quantize-pytorch's constructor sits in a table of its default and the reason vq
cannot take another value (:func:`refuse`): the default passes (the feature stays off), any
other value raises a ValueError naming the argument, and a name the anchor does not have
raises TypeError, as Python would.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from vq.quantizers import EMA, Gradient, GroupedResidualVQ, Learning, ResidualVQ, VectorQuantizer

#: argument → (vector-quantize-pytorch's default, why vq.compat takes no other value)
Refused = Mapping[str, tuple[object, str]]


def is_default(value: object, default: object) -> bool:
    """Whether ``value`` is the anchor's ``default`` (a class stands for any instance of it)."""
    if isinstance(default, type):
        return isinstance(value, default)
    if default is None or isinstance(default, bool):
        return value is default or (default is not None and value == default)
    try:
        return bool(value == default)
    except (TypeError, RuntimeError):  # tensors, modules
        return False


def refuse(owner: str, given: Mapping[str, object], table: Refused) -> None:
    """Raise for every argument in ``given`` that ``table`` does not allow at its value.

    Raises:
        TypeError: a name the anchor's ``owner`` does not take.
        ValueError: a known argument at a value other than the anchor's default.
    """
    for name, value in given.items():
        if name not in table:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
        default, reason = table[name]
        if not is_default(value, default):
            shown = f"{default.__name__}()" if isinstance(default, type) else repr(default)
            raise ValueError(
                f"{owner}: {name}={value!r} is not supported by vq.compat ({reason}); leave it "
                f"at vector-quantize-pytorch's default, {shown}"
            )


def refuse_call(owner: str, **given) -> None:
    """Forward arguments vq cannot honour: each must be None or False."""
    for name, value in given.items():
        if value is not None and value is not False:
            raise ValueError(f"{owner}: {name}={value!r} is not supported by vq.compat")


def check_sync(owner: str, sync_codebook: bool | None) -> None:
    """vq's layers synchronise their codebooks whenever a process group is initialised."""
    if sync_codebook is False:
        raise ValueError(
            f"{owner}: sync_codebook=False is not supported by vq.compat: vq's layers all-reduce "
            "their statistics over vq.parallel.current_group() whenever torch.distributed is "
            "initialised; wrap training in vq.distributed.use_group(None) to keep a layer local"
        )


def learning_rule(
    owner: str,
    *,
    decay: float,
    eps: float,
    kmeans_init: bool,
    kmeans_iters: int,
    threshold_ema_dead_code: float,
    commitment_weight: float,
    use_cosine_sim: bool,
    ema_update: bool | None,
    learnable_codebook: bool | None,
) -> Learning:
    """vector-quantize-pytorch's codebook update as a vq rule: EMA (``ema_update``, the
    default) with its decay and Laplace ε, or gradient learning (``learnable_codebook=True,
    ema_update=False``: the codebook loss weighs ``commitment_weight``, as the anchor's
    undetached commitment does); random start unless ``kmeans_init``; dead codes restarted
    below ``threshold_ema_dead_code`` (the usage average decays with ``decay`` either way)."""
    ema = True if ema_update is None else bool(ema_update)
    learnable = bool(learnable_codebook)
    common = dict(
        kmeans_init=bool(kmeans_init),
        kmeans_iters=int(kmeans_iters),
        dead_code_threshold=float(threshold_ema_dead_code),
    )
    if ema and learnable:
        raise ValueError(
            f"{owner}: learnable_codebook=True learns the codebook by gradient; pass "
            "ema_update=False with it (vector-quantize-pytorch refuses both at once too)"
        )
    if ema:
        return EMA(decay=decay, eps=eps, **common)
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


# -- the anchor's starting state --------------------------------------------------------------
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
    learning layer's codebooks, with the anchor's usage statistics (counts of 1, sums equal to
    the codewords)."""
    stacks = list(layer.rvqs) if isinstance(layer, GroupedResidualVQ) else [layer]
    for stack, part in zip(stacks, books.chunk(len(stacks)), strict=True):
        storage = stack.codebook[None] if isinstance(stack, VectorQuantizer) else stack.codebooks
        with torch.no_grad():
            storage.copy_(part)
        stack.learner.reset_(storage.detach(), torch.ones(part.shape[:2]))


def redraw_projections(layer: nn.Module) -> None:
    """Redraw a vq layer's ``project_in`` then ``project_out`` (when it has them) from the
    global generator, as the anchor's constructor draws its projections."""
    for name in ("project_in", "project_out"):
        linear = getattr(layer, name)
        if linear is not None:
            linear.reset_parameters()


@contextmanager
def frozen(layer: nn.Module, freeze: bool):
    """Run ``layer`` without updating its codebooks (eval mode) when ``freeze``."""
    if not freeze:  # touches nothing (a graph being exported sees no module mutated)
        yield
        return
    was = layer.training
    layer.train(False)
    try:
        yield
    finally:
        layer.train(was)


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


# -- layouts, masks and per-stage outputs ----------------------------------------------------
def lens_to_mask(lens: torch.Tensor, length: int) -> torch.Tensor:
    """Sequence lengths int Tensor[B] → bool Tensor[B, length], True inside each sequence."""
    return torch.arange(length, device=lens.device) < lens[:, None]


def drop_stages(codes: torch.Tensor, num_stages: torch.Tensor | None) -> torch.Tensor:
    """Codes int64 [B, ..., Q] with -1 at the stages quantizer dropout left out of each sample
    (``num_stages`` int64 [B], the stages each sample kept), as the anchor writes them."""
    if num_stages is None:
        return codes
    kept = num_stages.reshape(-1, *([1] * (codes.dim() - 1)))
    stage = torch.arange(codes.shape[-1], device=codes.device)
    return codes.masked_fill(stage >= kept, -1)


def stage_losses(
    training: bool, loss: torch.Tensor, stage_commitment: torch.Tensor, weight: float
) -> torch.Tensor:
    """The anchor's loss per stage, Tensor[*stages] (zeros in eval mode, as the anchor's).

    In value ``weight · stage_commitment`` (vq's detached per-stage commitments). Each entry
    carries the gradient of vq's ``loss`` (the mean over stages), so that their sum has the
    gradient of the sum of the anchor's per-stage losses and their mean that of their mean —
    what training code does with them; a weighted sum of stages does not."""
    if not training:
        return torch.zeros_like(stage_commitment)
    return weight * stage_commitment + (loss - loss.detach())


def residual_codes(codebooks: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Each stage's codeword of integer ``indices`` [..., q] (q <= Q stages; -1, and the
    stages past q, give zeros) from ``codebooks`` [Q, K, d] → Tensor[Q, ..., d]."""
    q = codebooks.shape[0]
    indices = indices.long()
    if indices.shape[-1] > q:
        raise ValueError(f"indices: expected at most {q} stages, got {indices.shape[-1]}")
    if indices.shape[-1] < q:
        indices = F.pad(indices, (0, q - indices.shape[-1]), value=-1)
    stage = torch.arange(q, device=indices.device)
    codes = codebooks[stage, indices.clamp_min(0)]  # [..., Q, d]
    codes = codes * (indices >= 0)[..., None].to(codes.dtype)
    return codes.movedim(-2, 0)


def sign_corners(indices: torch.Tensor, bits: int, scale: float) -> torch.Tensor:
    """LFQ's codewords of integer ``indices`` [...]: ``±scale`` per bit, most significant
    first → float32 Tensor[..., bits]."""
    shifts = torch.arange(bits - 1, -1, -1, device=indices.device)
    ones = (indices.long()[..., None] >> shifts) & 1
    return (2.0 * ones.float() - 1.0) * scale
