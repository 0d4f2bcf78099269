"""vq.compat against vector-quantize-pytorch: the same small autoencoder trained with each
library's layer, built from the same arguments and the same seed.

    python -m bench.compat_training [--steps 200] [--seeds 0 1 2] [--layers VectorQuantize …]

The model: an MLP encoder (32 → 64 → 16), the quantizer layer, an MLP decoder (16 → 64 → 32),
trained with Adam (lr 3e-3) on batches of 16 × 32 vectors drawn from a fixed mixture of 256
Gaussian clusters in 32 dimensions; the loss is the reconstruction MSE plus the layer's loss
(summed over stages). Both runs of a pair start from the same seed, so the encoder, decoder and
— where vq.compat draws them in the anchor's order — the projections and codebooks start equal,
and see the same batches. The metric is the reconstruction MSE averaged over the last 20 steps;
the table gives it for both libraries, their ratio (vq.compat / anchor) per seed and the ratio
of the means over seeds, and the median step time of each. → bench/results/compat_training.csv
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

DIM, LATENT, WINDOW = 32, 16, 20

#: layer name → its constructor arguments (the same for both libraries)
LAYERS: dict[str, tuple[str, dict]] = {
    "VectorQuantize": ("VectorQuantize", dict(dim=LATENT, codebook_size=64)),
    "VectorQuantize k-means, dead codes": (
        "VectorQuantize",
        dict(
            dim=LATENT,
            codebook_size=64,
            decay=0.99,
            kmeans_init=True,
            dead_code_threshold_ratio=0.1,
        ),
    ),
    "VectorQuantize straight through": (
        "VectorQuantize",
        dict(dim=LATENT, codebook_size=64, rotation_trick=False, commitment_weight=0.25),
    ),
    "VectorQuantize learnable": (
        "VectorQuantize",
        dict(dim=LATENT, codebook_size=64, learnable_codebook=True, ema_update=False),
    ),
    "VectorQuantize cosine": (
        "VectorQuantize",
        dict(dim=LATENT, codebook_size=64, use_cosine_sim=True),
    ),
    "VectorQuantize 4 heads": (
        "VectorQuantize",
        dict(
            dim=LATENT, codebook_size=32, heads=4, codebook_dim=4, separate_codebook_per_head=True
        ),
    ),
    "VectorQuantize codebook_dim 8": (
        "VectorQuantize",
        dict(dim=LATENT, codebook_size=64, codebook_dim=8),
    ),
    "ResidualVQ": ("ResidualVQ", dict(dim=LATENT, num_quantizers=4, codebook_size=32)),
    "GroupedResidualVQ": (
        "GroupedResidualVQ",
        dict(dim=LATENT, groups=2, num_quantizers=2, codebook_size=32),
    ),
    "FSQ": ("FSQ", dict(levels=[8, 5, 5, 5], dim=LATENT)),
    "LFQ": ("LFQ", dict(dim=LATENT, codebook_size=1024, entropy_loss_weight=0.1)),
    "ResidualFSQ": ("ResidualFSQ", dict(levels=[8, 5, 5, 5], num_quantizers=2, dim=LATENT)),
    "ResidualLFQ": ("ResidualLFQ", dict(dim=LATENT, num_quantizers=2, codebook_size=256)),
    "SimVQ": ("SimVQ", dict(dim=LATENT, codebook_size=64)),
    "ResidualSimVQ": ("ResidualSimVQ", dict(dim=LATENT, num_quantizers=2, codebook_size=32)),
}


class Autoencoder(nn.Module):
    """MLP encoder, quantizer layer, MLP decoder on [B, N, 32] batches."""

    def __init__(self, make_layer: Callable[[], nn.Module]):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(DIM, 64), nn.GELU(), nn.Linear(64, LATENT))
        self.quantizer = make_layer()
        self.decoder = nn.Sequential(nn.Linear(LATENT, 64), nn.GELU(), nn.Linear(64, DIM))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(reconstruction MSE, the layer's loss summed over stages)."""
        out = self.quantizer(self.encoder(x))
        layer_loss = out[2].sum() if len(out) > 2 else x.new_zeros(())
        return torch.nn.functional.mse_loss(self.decoder(out[0]), x), layer_loss


def batches(steps: int, seed: int, batch: int = 16, length: int = 32) -> list[torch.Tensor]:
    """``steps`` batches [batch, length, 32] from a mixture of 256 Gaussian clusters."""
    g = torch.Generator().manual_seed(10_000 + seed)
    centres = torch.randn(256, DIM, generator=g)
    picks = torch.randint(0, 256, (steps, batch, length), generator=g)
    return [centres[p] + 0.1 * torch.randn(*p.shape, DIM, generator=g) for p in picks]


def train(
    library, layer: str, seed: int, steps: int, batch: int = 16, length: int = 32
) -> tuple[list[float], float]:
    """Train the autoencoder around ``library``'s layer (``vector_quantize_pytorch`` or
    ``vq.compat``) for ``steps`` steps of ``batch × length`` vectors → (reconstruction MSE of
    every step, median seconds per step)."""
    cls, kwargs = LAYERS[layer]
    torch.manual_seed(seed)
    model = Autoencoder(lambda: getattr(library, cls)(**kwargs))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses, seconds = [], []
    for x in batches(steps, seed, batch, length):
        start = time.perf_counter()
        recon, layer_loss = model(x)
        optimizer.zero_grad()
        (recon + layer_loss).backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
        losses.append(float(recon.detach()))
    return losses, statistics.median(seconds)


def final_loss(losses: list[float]) -> float:
    """The reconstruction MSE averaged over the last ``WINDOW`` steps."""
    return sum(losses[-WINDOW:]) / len(losses[-WINDOW:])


def compare(layer: str, seeds: list[int], steps: int) -> dict:
    """Both libraries on every seed → the row of the table."""
    import vector_quantize_pytorch as anchor

    import vq.compat as compat

    ours, theirs, step_ours, step_theirs = [], [], [], []
    for seed in seeds:
        losses, step = train(compat, layer, seed, steps)
        ours.append(final_loss(losses)), step_ours.append(step)
        losses, step = train(anchor, layer, seed, steps)
        theirs.append(final_loss(losses)), step_theirs.append(step)
    mean_ours, mean_theirs = statistics.fmean(ours), statistics.fmean(theirs)
    return {
        "layer": layer,
        "vq.compat MSE": mean_ours,
        "anchor MSE": mean_theirs,
        "ratio": mean_ours / mean_theirs,
        "ratio per seed": " ".join(f"{a / b:.3f}" for a, b in zip(ours, theirs, strict=True)),
        "vq.compat ms/step": 1e3 * statistics.median(step_ours),
        "anchor ms/step": 1e3 * statistics.median(step_theirs),
    }


COLUMNS = [
    "layer",
    "vq.compat MSE",
    "anchor MSE",
    "ratio",
    "ratio per seed",
    "vq.compat ms/step",
    "anchor ms/step",
]


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    from bench.common import report

    torch.set_num_threads(args.threads)
    rows = [compare(layer, args.seeds, args.steps) for layer in args.layers]
    title = (
        f"vq.compat against vector-quantize-pytorch: {args.steps} Adam steps of the same "
        f"autoencoder, seeds {args.seeds}, reconstruction MSE over the last {WINDOW} steps"
    )
    report("compat_training", title, args.threads, rows, COLUMNS)
    return rows


if __name__ == "__main__":
    main()
