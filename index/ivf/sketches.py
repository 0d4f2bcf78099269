"""The sketches of an :class:`vq.index.IVFFlat` built with ``sketch=True``: 7-bit codes of each
stored row and four factors that bound the row's distance to any query, so that the CPU scans
compute exact distances only for rows that may enter the top k (the same results; the math and
the kernels are in :mod:`vq.kernels.exact.sketch`). Written in torch, so that rows added on any
device get their sketches where they are encoded.
"""

from __future__ import annotations

import torch

from vq.kernels.exact.sketch import CENTRE, LEVELS, sketch_width


def sketch_ranges(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dimension ranges of the codes from training vectors ``x`` float [n, d]: (low, step)
    float32 [d], the codes' levels spread from the least to the largest value (step 1 where a
    dimension is constant). Rows outside the ranges are clipped: their bounds stay valid
    (each row's coding error is stored), only looser."""
    x = x.float()
    low, high = x.min(dim=0).values, x.max(dim=0).values
    step = (high - low) / LEVELS
    return low, torch.where(step > 0, step, torch.ones_like(step))


def sketch_rows(
    x: torch.Tensor, centroids: torch.Tensor, low: torch.Tensor, step: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sketches of rows ``x`` float [b, d] stored in the lists of ``centroids`` float [b, d]
    (each row's own centroid), from the ranges ``low``/``step`` float32 [d].

    Returns:
        codes uint8 [b, width] (width: d rounded up to 32, zeros past d) and factors float32
        [b, 4]: ⟨c, e⟩, ‖e‖, ‖u - 64‖, ‖x‖² (e the coding error; computed in float64, then
        the two norms rounded up to float32, so that the bounds never come out smaller).
    """
    b, d = x.shape
    x64, c64 = x.double(), centroids.double()
    u = ((x64 - low.double()) / step.double()).round().clamp(0, LEVELS)
    e = x64 - (low.double() + step.double() * u)
    codes = torch.zeros(b, sketch_width(d), dtype=torch.uint8, device=x.device)
    codes[:, :d] = u.to(torch.uint8)
    norms = torch.stack([e.norm(dim=1), (u - CENTRE).norm(dim=1)], dim=1)
    up = norms.float().double() < norms  # (rounded down to float32: one step up)
    above = torch.nextafter(norms.float(), torch.full_like(norms.float(), float("inf")))
    norms = torch.where(up, above.double(), norms)
    factors = torch.stack(
        [(c64 * e).sum(dim=1), norms[:, 0], norms[:, 1], (x64 * x64).sum(dim=1)], dim=1
    )
    return codes, factors.float()
