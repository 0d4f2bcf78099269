"""Quantizer layers: vq against vector-quantize-pytorch (lucidrains) at the same configurations.

    python -m bench.vqvae_nsynth [--steps 300] [--threads 2]
                                 [--micro-only | --vqvae-only | --layers-only] [--layers …]

Three parts; in all the systems run alternately (A B A B …) on the same inputs and threads.

1. One training step of a quantizer layer (forward, loss, backward) on a 32×256×256 batch:
   VectorQuantize (1024 codes, EMA, k-means init, dead-code restart) and an 8-stage ResidualVQ
   of such codebooks (see :mod:`bench.vqvae_micro`). → bench/results/vq_layer_step.csv
2. A small convolutional VQ-VAE on log-mel spectrograms of the synthetic NSynth-format notes
   (the main job's set, built once; a subset of its notes): one model with vq.ResidualVQ and
   one with vector_quantize_pytorch.ResidualVQ — 4 stages of 256 codes, EMA, k-means init,
   dead-code restart, commitment 0.25 averaged over stages on both sides — with the same
   initial weights, batches and optimizer, trained step for step. Reports test reconstruction
   error, perplexity and codes used per stage (averaged) and step time.
   → bench/results/vqvae_nsynth.csv
3. The same VQ-VAE with each layer of issue 21 — LFQ, ResidualFSQ, ResidualLFQ,
   GroupedResidualVQ, SimVQ, ResidualVQ with SimVQ — against vector-quantize-pytorch's
   equivalent (see :mod:`bench.vqvae_layers`): test reconstruction error and codebook usage
   per layer, over one or more seeds (``--seed 0 1 2 3``).
   → bench/results/vqvae_nsynth_layers.csv (and vqvae_nsynth_layers_seeds.csv)

The model, the data and the alternating training loop are in :mod:`bench.vqvae_model`.

Needs the bench extra (vector-quantize-pytorch) and the audio extra (torchaudio).
"""

from __future__ import annotations

import argparse
import statistics

from bench import vqvae_layers, vqvae_micro
from bench.common import report, set_threads
from bench.vqvae_model import VQVAE, make_vqvae, spectrograms, train_alternately


# -- part 2: a VQ-VAE on NSynth log-mels -------------------------------------------------------
def vqvae(args, x_train, x_test) -> list[dict]:
    import copy

    import torch
    from vector_quantize_pytorch import ResidualVQ

    import vq

    torch.manual_seed(0)
    encoder, decoder = make_vqvae(args.n_mels, args.hidden, args.latent)
    k, q = args.codes, args.stages

    ours = vq.ResidualVQ(
        args.latent,
        q,
        k,
        learning=vq.EMA(decay=0.99, kmeans_iters=10, dead_code_threshold=2.0),
        commitment_weight=0.25,
        channel_first=True,
    )

    def quantize_ours(z):
        out = ours(z)
        return out.quantized, out.codes, out.loss

    anchor = ResidualVQ(
        dim=args.latent,
        num_quantizers=q,
        codebook_size=k,
        decay=0.99,
        kmeans_init=True,
        kmeans_iters=10,
        threshold_ema_dead_code=2,
        commitment_weight=0.25,
        rotation_trick=False,
    )

    def quantize_theirs(z):
        z_q, codes, losses = anchor(z.transpose(1, 2))
        return z_q.transpose(1, 2), codes, losses.mean()  # the mean over stages, as vq

    models = {
        "vq": VQVAE(encoder, decoder, ours, quantize_ours, args.lr),
        "vector-quantize-pytorch": VQVAE(
            copy.deepcopy(encoder), copy.deepcopy(decoder), anchor, quantize_theirs, args.lr
        ),
    }
    trained = train_alternately(models, x_train, args, seed=1)
    times, first, losses = trained["times"], trained["first"], trained["loss"]
    rows = []
    ref = statistics.median(times["vector-quantize-pytorch"])
    for name, model in models.items():
        scores = model.evaluate(x_test, k)
        median = statistics.median(times[name])
        rows.append(
            {
                "system": name,
                "steps": args.steps,
                "train loss": losses[name],
                "test reconstruction MSE": scores["test MSE"],
                "perplexity (mean over stages)": scores["perplexity"],
                "codes used (mean over stages)": scores["used"],
                "step ms (median)": 1000 * median,
                "step time / anchor": median / ref,
                "first step seconds": first[name],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="threads for both systems")
    p.add_argument("--micro-only", action="store_true", help="only part 1 (one layer step)")
    p.add_argument("--vqvae-only", action="store_true", help="only part 2 (the VQ-VAE)")
    p.add_argument("--layers-only", action="store_true", help="only part 3 (issue 21's layers)")
    g = p.add_argument_group("part 1: one training step of a layer")
    g.add_argument("--micro-batch", type=int, default=32, help="batch B of the [B, N, D] input")
    g.add_argument("--micro-len", type=int, default=256, help="vectors N per batch element")
    g.add_argument("--micro-dim", type=int, default=256, help="dimension D")
    g.add_argument("--micro-codes", type=int, default=1024, help="codes per codebook")
    g.add_argument("--micro-stages", type=int, default=8, help="ResidualVQ stages")
    g.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    g = p.add_argument_group("part 2: VQ-VAE on NSynth log-mel spectrograms")
    g.add_argument("--data-dir", default=None, help="where the synthetic set lives (~/.cache/vq)")
    g.add_argument("--instruments", type=int, default=330, help="synthetic set (the main job's)")
    g.add_argument("--max-train", type=int, default=600, help="train notes used (spread evenly)")
    g.add_argument("--max-test", type=int, default=100, help="test notes used")
    g.add_argument("--n-mels", type=int, default=64, help="mel bands")
    g.add_argument("--note-frames", type=int, default=240, help="frames kept per note (÷ 4)")
    g.add_argument("--frames", type=int, default=64, help="frames per training crop (÷ 4)")
    g.add_argument("--batch", type=int, default=32, help="crops per step")
    g.add_argument("--steps", type=int, default=300, help="training steps")
    g.add_argument("--hidden", type=int, default=128, help="conv channels")
    g.add_argument("--latent", type=int, default=64, help="latent (quantizer) dimension")
    g.add_argument("--codes", type=int, default=256, help="codes per stage")
    g.add_argument("--stages", type=int, default=4, help="ResidualVQ stages")
    g.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    g.add_argument("--layers", nargs="*", default=None, help="part 3's layers (default all)")
    g.add_argument(
        "--seed", type=int, nargs="+", default=[0], help="part 3's seeds (weights and batches)"
    )
    g.add_argument(
        "--control",
        action="store_true",
        help="part 3: the anchor against itself from a start perturbed by 1e-6 (the noise floor)",
    )
    g.add_argument(
        "--vq-default-too",
        action="store_true",
        help="part 3: also train vq's residual layers with their default gradient rule",
    )
    args = p.parse_args(argv)
    if args.micro_only + args.vqvae_only + args.layers_only > 1:
        p.error("give at most one of --micro-only, --vqvae-only, --layers-only")
    set_threads(args.threads)
    parts = {
        "micro": not (args.vqvae_only or args.layers_only),
        "vqvae": not (args.micro_only or args.layers_only),
        "layers": not (args.micro_only or args.vqvae_only),
    }
    rows = []
    if parts["micro"]:
        micro = vqvae_micro.layer_step(args)
        columns = vqvae_micro.COLUMNS
        title = (
            f"One training step of a quantizer layer on a {args.micro_batch}×{args.micro_len}×"
            f"{args.micro_dim} batch ({args.rounds} alternating rounds; vq / anchor: best times)"
        )
        report("vq_layer_step", title, args.threads, micro, columns)
        rows += micro
    data = spectrograms(args) if parts["vqvae"] or parts["layers"] else None
    if parts["vqvae"]:
        if parts["micro"]:
            print()
        trained = vqvae(args, *data)
        columns = [
            "system",
            "steps",
            "train loss",
            "test reconstruction MSE",
            "perplexity (mean over stages)",
            "codes used (mean over stages)",
            "step ms (median)",
            "step time / anchor",
            "first step seconds",
        ]
        title = (
            f"VQ-VAE on NSynth log-mels: ResidualVQ {args.stages}×{args.codes} codes, "
            f"{args.latent}-d latents, {args.steps} steps of {args.batch} crops"
        )
        report("vqvae_nsynth", title, args.threads, trained, columns)
        rows += trained
    if parts["layers"]:
        print()
        rows += vqvae_layers.main_part(args, *data)
    return rows


if __name__ == "__main__":
    main()
