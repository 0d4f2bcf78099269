"""Part 1 of bench.vqvae_nsynth: one training step of a quantizer layer (forward, loss,
backward), vq against vector-quantize-pytorch, alternating on the same batch and threads.

VectorQuantize (dim 256, 1024 codes, EMA decay 0.99, k-means init, dead-code threshold 2) and
an 8-stage ResidualVQ of such codebooks, straight-through gradients on both sides, on a
32×256×256 batch (``--micro-*`` options of bench.vqvae_nsynth). Reports the best and median
step time, the ratio of the best times, the first step (k-means initialisation) and the codebook
usage on the batch after the timed steps. → bench/results/vq_layer_step.csv
"""

from __future__ import annotations

import statistics
import time

from bench.vqvae_model import usage

COLUMNS = [
    "layer",
    "system",
    "best seconds",
    "median seconds",
    "vq / anchor",
    "first step seconds",
    "perplexity",
    "codes used",
]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate_samples(systems: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of one call of each system, ``rounds`` times, alternating A B A B."""
    samples: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(rounds):
        for name, fn in systems.items():
            samples[name].append(timed(fn))
    return samples


# -- part 1: one training step of a layer --------------------------------------------------------
def layer_step(args) -> list[dict]:
    import torch
    from vector_quantize_pytorch import ResidualVQ, VectorQuantize

    import vq

    b, n, d = args.micro_batch, args.micro_len, args.micro_dim
    k, q = args.micro_codes, args.micro_stages
    x = torch.randn(b, n, d, generator=torch.Generator().manual_seed(0))
    learning = vq.EMA(decay=0.99, kmeans_iters=10, dead_code_threshold=2.0)
    theirs = dict(
        decay=0.99,
        kmeans_init=True,
        kmeans_iters=10,
        threshold_ema_dead_code=2,
        rotation_trick=False,
        commitment_weight=1.0,
    )
    cases = [
        (
            f"VectorQuantize {d}d, {k} codes",
            lambda: vq.VectorQuantizer(d, k, learning=learning),
            lambda: VectorQuantize(dim=d, codebook_size=k, **theirs),
        ),
        (
            f"ResidualVQ {q}×{k} codes, {d}d",
            lambda: vq.ResidualVQ(d, q, k, learning=learning),
            lambda: ResidualVQ(dim=d, num_quantizers=q, codebook_size=k, **theirs),
        ),
    ]
    rows = []
    for label, make_ours, make_theirs in cases:
        torch.manual_seed(0)
        ours, anchor = make_ours(), make_theirs()
        last = {}

        def step_ours(layer=ours, last=last):
            xi = x.clone().requires_grad_()
            out = layer(xi)
            (out.loss + out.quantized.square().mean()).backward()
            last["vq"] = out.codes

        def step_theirs(layer=anchor, last=last):
            xi = x.clone().requires_grad_()
            quantized, codes, loss = layer(xi)
            (loss.sum() + quantized.square().mean()).backward()
            last["vector-quantize-pytorch"] = codes

        systems = {"vq": step_ours, "vector-quantize-pytorch": step_theirs}
        first = {name: timed(fn) for name, fn in systems.items()}  # k-means initialisation
        for fn in systems.values():  # warm-up
            fn()
        samples = alternate_samples(systems, args.rounds)
        best = {name: min(s) for name, s in samples.items()}
        for name in systems:
            perplexity, used = usage(last[name], k)
            rows.append(
                {
                    "layer": label,
                    "system": name,
                    "best seconds": best[name],
                    "median seconds": statistics.median(samples[name]),
                    "vq / anchor": best[name] / best["vector-quantize-pytorch"],
                    "first step seconds": first[name],
                    "perplexity": perplexity,
                    "codes used": used,
                }
            )
    return rows
