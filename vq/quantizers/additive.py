"""The static-shape graphs of additive (residual) codes: encode (greedy, by distance or by
cosine, or beam search), decode and ADC tables. What :class:`vq.ResidualVQ` (and the grouped
and scalar residual layers) run off the numba path, in compiled graphs and in :mod:`vq.export`;
static shapes throughout (top-k, gathers from constant tables, matrix products)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vq.quantizers.codec import Metric
from vq.quantizers.vector import nearest_codeword


def additive_tables(queries: torch.Tensor, codebooks: torch.Tensor, metric: Metric) -> torch.Tensor:
    """ADC tables of additive codes (one codeword per stage, summed): float32 queries [nq, d],
    codebooks [Q, K, d] → [nq, Q, K]; for "ip" they sum to ⟨q, x̂⟩, for "l2" to ``||q||² -
    2⟨q, x̂⟩ + Σ_m ||c_m||²`` (see :class:`ResidualVQ`)."""
    dots = torch.einsum("nd,qkd->nqk", queries, codebooks)
    if metric == "ip":
        return dots
    tables = (codebooks * codebooks).sum(-1)[None] - 2.0 * dots
    tables[:, 0] += (queries * queries).sum(-1, keepdim=True)
    return tables


def residual_encode(
    x: torch.Tensor, codebooks: torch.Tensor, beam_size: int, cosine: bool = False
) -> torch.Tensor:
    """Residual codes as one static-shape graph: greedy (``beam_size`` 1: the nearest codeword
    of each stage's residual — by cosine, the nearest to the l2-normalised residual, when
    ``cosine``) or beam search (:func:`beam_step` per stage, the best path).

    Args:
        x: float32 Tensor[n, d]; codebooks: float32 Tensor[Q, K, d] (unit rows for cosine);
        beam_size: B >= 1 (1 when ``cosine``).

    Returns:
        int64 Tensor[n, Q].
    """
    if beam_size == 1:
        residual, codes = x, []
        for codebook in codebooks.unbind(0):
            idx = nearest_codeword(F.normalize(residual, dim=-1) if cosine else residual, codebook)
            residual = residual - codebook.index_select(0, idx)
            codes.append(idx)
        return torch.stack(codes, dim=1)
    codes, residuals = None, x[:, None, :]
    for codebook in codebooks.unbind(0):
        codes, residuals, _ = beam_step(codes, residuals, codebook, beam_size)
    return codes[:, 0]


def beam_step(
    codes: torch.Tensor | None, residuals: torch.Tensor, codebook: torch.Tensor, beam: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Extend every partial encoding by one stage and keep the ``beam`` best: a top-k over
    ``B × K`` candidates, parents followed by gathers from flattened rows (a candidate's parent
    and codeword are read from constant tables: Gathers in ONNX, not division arithmetic).

    Args:
        codes: int64 Tensor[n, B, m] (None before the first stage); residuals: float32
            Tensor[n, B, d]; codebook: float32 Tensor[K, d] of this stage; beam: B' >= 1.

    Returns:
        codes int64 [n, B', m + 1], residuals float32 [n, B', d], squared errors [n, B'].
    """
    (n, b, d), k = residuals.shape, codebook.shape[0]
    r2, norms = (residuals * residuals).sum(-1, keepdim=True), (codebook * codebook).sum(-1)
    dist = torch.addmm(norms, residuals.reshape(n * b, d), codebook.T, alpha=-2.0)
    dist = dist.reshape(n, b, k) + r2  # [n, B, K]
    keep = min(beam, b * k)
    err, flat = torch.topk(dist.reshape(n, b * k), keep, dim=1, largest=False, sorted=True)
    slots = torch.arange(b * k, device=residuals.device)  # constants of the graph
    parent = (slots // k).index_select(0, flat.reshape(-1)).reshape(n, keep)
    code = (slots % k).index_select(0, flat.reshape(-1)).reshape(n, keep)
    rows = (parent + torch.arange(n, device=residuals.device)[:, None] * b).reshape(-1)
    words = codebook.index_select(0, code.reshape(-1)).reshape(n, keep, d)
    residuals = residuals.reshape(n * b, d).index_select(0, rows).reshape(n, keep, d) - words
    if codes is None:
        return code[:, :, None], residuals, err
    m = codes.shape[2]
    kept = codes.reshape(n * b, m).index_select(0, rows).reshape(n, keep, m)
    return torch.cat([kept, code[:, :, None]], dim=2), residuals, err


def residual_decode(codes: torch.Tensor, codebooks: torch.Tensor) -> torch.Tensor:
    """Reconstructions as one static-shape graph, the sum of one codeword per stage: integer
    codes Tensor[n, Q], codebooks float32 Tensor[Q, K, d] → float32 Tensor[n, d]."""
    q, k, d = codebooks.shape
    offsets = torch.arange(q, device=codes.device) * k  # a constant of the graph
    words = codebooks.reshape(-1, d).index_select(0, (codes.long() + offsets).reshape(-1))
    return words.reshape(-1, q, d).sum(dim=1)
