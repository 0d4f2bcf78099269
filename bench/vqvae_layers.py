"""Part 3 of bench.vqvae_nsynth: the NSynth VQ-VAE trained with each layer of issue 21, vq's
against vector-quantize-pytorch's equivalent, same seeds, initial weights and batches.

    python -m bench.vqvae_nsynth --layers-only [--steps 300] [--seed 0] [--layers LFQ SimVQ …]

Layers (latent dimension D = ``--latent``, ``--codes`` codes per codebook where one applies):
LFQ (2^log2(codes·4) codes, entropy 0.1, commitment 0.25), ResidualFSQ ([8, 5, 5, 5] × stages),
ResidualLFQ (stages × codes, entropy 0.1, no commitment: the anchor's defaults),
GroupedResidualVQ (2 groups × stages × codes: EMA 0.99, k-means init, dead-code threshold 2,
commitment 0.25), SimVQ (codes·4 codes, commitment 0.25 and the rotation trick: the anchor's
defaults) and ResidualVQ with SimVQ (vector-quantize-pytorch's ResidualSimVQ: stages × codes).
Each VQ-VAE pair starts from the same encoder/decoder weights and sees the same crops in the
same order; both train alternately, step for step (the harness of part 2). Reports test
reconstruction error and codebook usage (perplexity and fraction of codes used on the test
set, averaged over codebooks). → bench/results/vqvae_nsynth_layers.csv
"""

from __future__ import annotations

import math


def _channels_last(quantize):
    """Adapt an anchor layer taking [B, T, D] to the harness's [B, D, T]."""

    def run(z):
        out = quantize(z.transpose(1, 2))
        z_q, codes = out[0], out[1]
        loss = out[2].sum() if len(out) > 2 else z.new_zeros(())
        return z_q.transpose(1, 2), codes, loss

    return run


def layer_pairs(args) -> dict:
    """name → (make ours, make theirs, our quantize adapter, theirs', codebook size); the
    adapters map ``z`` [B, D, T] to ``(z_q [B, D, T], codes [B, T, C], loss)``."""
    import vector_quantize_pytorch as vqp

    import vq

    d, k, q = args.latent, args.codes, args.stages
    big = 1 << math.ceil(math.log2(4 * k))  # one codebook of 4 × the per-stage codes
    ema = vq.EMA(decay=0.99, kmeans_iters=10, dead_code_threshold=2.0)
    theirs_ema = dict(decay=0.99, kmeans_init=True, kmeans_iters=10, threshold_ema_dead_code=2)

    def ours(out):
        codes = out.codes
        return out.quantized, codes.reshape(*codes.shape[:2], -1), out.loss

    def grouped_theirs(layer):
        def run(z):
            z_q, codes, losses = layer(z.transpose(1, 2))  # codes [G, B, T, Q]
            codes = codes.permute(1, 2, 0, 3).reshape(z.shape[0], z.shape[2], -1)
            return z_q.transpose(1, 2), codes, losses.mean()

        return run

    def mean_loss(layer):  # ResidualSimVQ: a commitment per stage; vq's is their mean
        def run(z):
            z_q, codes, losses = layer(z.transpose(1, 2))
            return z_q.transpose(1, 2), codes, losses.mean()

        return run

    return {
        "LFQ": (
            lambda: vq.LFQ(d, big, commitment_weight=0.25, channel_first=True),
            lambda: vqp.LFQ(dim=d, codebook_size=big, commitment_loss_weight=0.25),
            ours,
            _channels_last,
            big,
        ),
        "ResidualFSQ": (
            lambda: vq.ResidualFSQ([8, 5, 5, 5], q, dim=d, channel_first=True),
            lambda: vqp.ResidualFSQ(dim=d, levels=[8, 5, 5, 5], num_quantizers=q),
            ours,
            _channels_last,
            1000,
        ),
        "ResidualLFQ": (
            lambda: vq.ResidualLFQ(d, q, k, commitment_weight=0.0, channel_first=True),
            lambda: vqp.ResidualLFQ(dim=d, num_quantizers=q, codebook_size=k),
            ours,
            _channels_last,
            k,
        ),
        "GroupedResidualVQ": (
            lambda: vq.GroupedResidualVQ(
                d, 2, q, k, learning=ema, commitment_weight=0.25, channel_first=True
            ),
            lambda: vqp.GroupedResidualVQ(
                dim=d,
                groups=2,
                num_quantizers=q,
                codebook_size=k,
                commitment_weight=0.25,
                rotation_trick=False,
                **theirs_ema,
            ),
            ours,
            grouped_theirs,
            k,
        ),
        "SimVQ": (
            lambda: vq.VectorQuantizer(
                d,
                big,
                learning="simvq",
                commitment_weight=0.25,
                rotation_trick=True,
                channel_first=True,
            ),
            lambda: vqp.SimVQ(dim=d, codebook_size=big),
            ours,
            _channels_last,
            big,
        ),
        "ResidualVQ, SimVQ": (
            lambda: vq.ResidualVQ(
                d,
                q,
                k,
                learning="simvq",
                commitment_weight=0.25,
                rotation_trick=True,
                channel_first=True,
            ),
            lambda: vqp.ResidualSimVQ(dim=d, num_quantizers=q, codebook_size=k),
            ours,
            mean_loss,
            k,
        ),
    }


def train_pair(args, x_train, x_test, name: str, pair) -> list[dict]:
    """Train vq's and the anchor's VQ-VAE with layer ``name`` step for step; their rows."""
    import copy
    import statistics
    import time

    import torch

    from bench.vqvae_nsynth import VQVAE, make_vqvae

    make_ours, make_theirs, adapt_ours, adapt_theirs, size = pair
    torch.manual_seed(args.seed)
    encoder, decoder = make_vqvae(args.n_mels, args.hidden, args.latent)
    torch.manual_seed(args.seed)  # SimVQ: the same frozen codebooks and maps on both sides
    ours = make_ours()
    torch.manual_seed(args.seed)
    theirs = make_theirs()
    models = {
        "vq": VQVAE(encoder, decoder, ours, lambda z: adapt_ours(ours(z)), args.lr),
        "vector-quantize-pytorch": VQVAE(
            copy.deepcopy(encoder), copy.deepcopy(decoder), theirs, adapt_theirs(theirs), args.lr
        ),
    }
    gen = torch.Generator().manual_seed(args.seed + 1)  # the same crops for every layer, system
    times: dict[str, list[float]] = {system: [] for system in models}
    for step in range(args.steps):
        notes = torch.randint(x_train.shape[0], (args.batch,), generator=gen)
        starts = torch.randint(x_train.shape[2] - args.frames + 1, (args.batch,), generator=gen)
        crops = torch.stack(
            [x_train[i, :, s : s + args.frames] for i, s in zip(notes, starts, strict=True)]
        )
        for system in models if step % 2 == 0 else reversed(models):
            start = time.perf_counter()
            models[system].train_step(crops)
            if step >= min(5, args.steps - 1):
                times[system].append(time.perf_counter() - start)
    rows = []
    for system, model in models.items():
        scores = model.evaluate(x_test, size)
        rows.append(
            {
                "layer": name,
                "system": system,
                "steps": args.steps,
                "test reconstruction MSE": scores["test MSE"],
                "perplexity (mean over codebooks)": scores["perplexity"],
                "codes used (mean over codebooks)": scores["used"],
                "step ms (median)": 1000 * statistics.median(times[system]),
            }
        )
    ref = rows[1]
    for row in rows:
        row["MSE / anchor"] = row["test reconstruction MSE"] / ref["test reconstruction MSE"]
        row["used / anchor"] = row["codes used (mean over codebooks)"] / max(
            ref["codes used (mean over codebooks)"], 1e-12
        )
    return rows


COLUMNS = [
    "layer",
    "system",
    "steps",
    "test reconstruction MSE",
    "MSE / anchor",
    "perplexity (mean over codebooks)",
    "codes used (mean over codebooks)",
    "used / anchor",
    "step ms (median)",
]


def run(args, x_train, x_test) -> list[dict]:
    pairs = layer_pairs(args)
    chosen = args.layers or list(pairs)
    unknown = [name for name in chosen if name not in pairs]
    if unknown:
        raise SystemExit(f"--layers: unknown {unknown}; choose from {list(pairs)}")
    rows = []
    for name in chosen:
        rows += train_pair(args, x_train, x_test, name, pairs[name])
    return rows
