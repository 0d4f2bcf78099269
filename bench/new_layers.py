"""The layers of issue 21 against vector-quantize-pytorch: one training step each, same config.

    python -m bench.new_layers [--batch 16] [--length 256] [--dim 256] [--rounds 7] [--threads 2]

LFQ (2^12 codes, entropy and commitment losses), ResidualFSQ ([8, 5, 5, 5] × 4 stages),
ResidualLFQ (4 stages of 2^10 codes) and GroupedResidualVQ (2 groups × 4 stages × 256 codes,
EMA, k-means init, dead-code threshold 2) on a fixed Gaussian batch: forward, loss, backward,
the two systems alternating (A B A B …) on the same input and threads; the ratio is of the best
times. → bench/results/vq_new_layer_step.csv. Needs the bench extra (vector-quantize-pytorch).
"""

from __future__ import annotations

import argparse
import statistics

from bench.common import report, set_threads
from bench.vqvae_micro import alternate_samples, timed


def cases(d: int):
    import vector_quantize_pytorch as vqp

    import vq

    ema = vq.EMA(decay=0.99, kmeans_iters=10, dead_code_threshold=2.0)
    theirs_ema = dict(decay=0.99, kmeans_init=True, kmeans_iters=10, threshold_ema_dead_code=2)
    return [
        (
            "LFQ, 2^12 codes",
            lambda: vq.LFQ(d, 4096, commitment_weight=0.25),
            lambda: vqp.LFQ(dim=d, codebook_size=4096, commitment_loss_weight=0.25),
        ),
        (
            "ResidualFSQ [8,5,5,5] × 4",
            lambda: vq.ResidualFSQ([8, 5, 5, 5], 4, dim=d),
            lambda: vqp.ResidualFSQ(dim=d, levels=[8, 5, 5, 5], num_quantizers=4),
        ),
        (
            "ResidualLFQ 4 × 2^10 codes",
            lambda: vq.ResidualLFQ(d, 4, 1024, commitment_weight=0.0),
            lambda: vqp.ResidualLFQ(dim=d, num_quantizers=4, codebook_size=1024),
        ),
        (
            "GroupedResidualVQ 2 × 4 × 256 codes",
            lambda: vq.GroupedResidualVQ(d, 2, 4, 256, learning=ema),
            lambda: vqp.GroupedResidualVQ(
                dim=d, groups=2, num_quantizers=4, codebook_size=256, **theirs_ema
            ),
        ),
    ]


def run(args) -> list[dict]:
    import torch

    x = torch.randn(args.batch, args.length, args.dim, generator=torch.Generator().manual_seed(0))
    rows = []
    for label, make_ours, make_theirs in cases(args.dim):
        torch.manual_seed(0)
        ours, anchor = make_ours(), make_theirs()

        def step_ours(layer=ours):
            out = layer(x.clone().requires_grad_())
            (out.loss + out.quantized.square().mean()).backward()

        def step_theirs(layer=anchor):
            res = layer(x.clone().requires_grad_())
            loss = res[2].sum() if len(res) > 2 else 0.0
            (loss + res[0].square().mean()).backward()

        systems = {"vq": step_ours, "vector-quantize-pytorch": step_theirs}
        first = {name: timed(fn) for name, fn in systems.items()}
        for fn in systems.values():  # warm-up
            fn()
        samples = alternate_samples(systems, args.rounds)
        best = {name: min(s) for name, s in samples.items()}
        for name in systems:
            rows.append(
                {
                    "layer": label,
                    "system": name,
                    "best seconds": best[name],
                    "median seconds": statistics.median(samples[name]),
                    "vq / anchor": best[name] / best["vector-quantize-pytorch"],
                    "first step seconds": first[name],
                }
            )
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=16, help="batch B of the [B, N, D] input")
    p.add_argument("--length", type=int, default=256, help="vectors N per batch element")
    p.add_argument("--dim", type=int, default=256, help="dimension D")
    p.add_argument("--rounds", type=int, default=7, help="alternating timing rounds")
    p.add_argument("--threads", type=int, default=2, help="threads for both systems")
    args = p.parse_args(argv)
    set_threads(args.threads)
    rows = run(args)
    columns = ["layer", "system", "best seconds", "median seconds", "vq / anchor"]
    columns.append("first step seconds")
    title = (
        f"One training step of the issue-21 layers on a {args.batch}×{args.length}×{args.dim} "
        f"batch ({args.rounds} alternating rounds; vq / anchor: best times)"
    )
    report("vq_new_layer_step", title, args.threads, rows, columns)
    return rows


if __name__ == "__main__":
    main()
