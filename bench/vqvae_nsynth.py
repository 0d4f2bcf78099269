"""Quantizer layers: vq against vector-quantize-pytorch (lucidrains) at the same configurations.

    python -m bench.vqvae_nsynth [--steps 300] [--threads 2]
                                 [--micro-only | --vqvae-only | --layers-only] [--layers …]

Three parts; in all the systems run alternately (A B A B …) on the same inputs and threads.

1. One training step of a quantizer layer (forward, loss, backward) on a 32×256×256 batch:
   VectorQuantize(dim 256, 1024 codes, EMA decay 0.99, k-means init, dead-code threshold 2)
   and an 8-stage ResidualVQ of such codebooks, straight-through gradients on both sides.
   Reports the best and median step time over the rounds, the ratio of the best times, the
   first step (k-means initialisation) and the codebook usage (perplexity, fraction of codes
   used) on the batch after the timed steps. → bench/results/vq_layer_step.csv
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
   per layer. → bench/results/vqvae_nsynth_layers.csv

Needs the bench extra (vector-quantize-pytorch) and the audio extra (torchaudio).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

from bench import vqvae_layers
from bench.common import report, set_threads


# -- shared helpers ------------------------------------------------------------------------------
def usage(codes, codebook_size: int) -> tuple[float, float]:
    """Perplexity and fraction of codes used, averaged over the codebooks of ``codes``
    (integer Tensor[..., Q] for Q stages, or [...] for one codebook)."""
    import torch

    from vq.quantizers.functional import usage_statistics

    c = codes.long().reshape(-1, codes.shape[-1] if codes.dim() > 2 else 1)
    counts = torch.stack([torch.bincount(col, minlength=codebook_size) for col in c.T])
    perplexity, used = usage_statistics(counts.float())
    return float(perplexity.mean()), float(used.mean())


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


# -- part 2: a VQ-VAE on NSynth log-mels ---------------------------------------------------------
def spectrograms(args):
    """Normalised log-mel spectrograms of a subset of the train and test notes:
    float32 [n_train, n_mels, frames], [n_test, n_mels, frames]."""
    import numpy as np
    import torch
    import torchaudio

    from vq.apps.nsynth import default_data_dir, synthetic_dataset

    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    train, test = synthetic_dataset(data_dir, args.instruments, seed=0, verbose=True)
    mel = torchaudio.transforms.MelSpectrogram(
        sample_rate=16_000, n_fft=1024, hop_length=256, n_mels=args.n_mels
    )

    def log_mels(dataset, limit):
        picks = np.linspace(0, len(dataset) - 1, min(limit, len(dataset))).round().astype(int)
        out = []
        for start in range(0, len(picks), 64):
            waves = torch.stack([dataset[int(i)][0] for i in picks[start : start + 64]])
            with torch.no_grad():
                out.append(torch.log(mel(waves) + 1e-6)[..., : args.note_frames])
        return torch.cat(out)

    x_train, x_test = log_mels(train, args.max_train), log_mels(test, args.max_test)
    mean = x_train.mean(dim=(0, 2), keepdim=True)
    std = x_train.std(dim=(0, 2), keepdim=True).clamp_min(1e-3)
    return (x_train - mean) / std, (x_test - mean) / std


def make_vqvae(n_mels: int, hidden: int, latent: int):
    """Conv1d encoder (time ÷ 4) and decoder over [B, n_mels, T] spectrograms."""
    from torch import nn

    encoder = nn.Sequential(
        nn.Conv1d(n_mels, hidden, 3, padding=1),
        nn.GELU(),
        nn.Conv1d(hidden, hidden, 4, stride=2, padding=1),
        nn.GELU(),
        nn.Conv1d(hidden, hidden, 4, stride=2, padding=1),
        nn.GELU(),
        nn.Conv1d(hidden, latent, 1),
    )
    decoder = nn.Sequential(
        nn.Conv1d(latent, hidden, 3, padding=1),
        nn.GELU(),
        nn.ConvTranspose1d(hidden, hidden, 4, stride=2, padding=1),
        nn.GELU(),
        nn.ConvTranspose1d(hidden, hidden, 4, stride=2, padding=1),
        nn.GELU(),
        nn.Conv1d(hidden, n_mels, 3, padding=1),
    )
    return encoder, decoder


class VQVAE:
    """Encoder → quantizer → decoder; ``quantize(z [B, D, T]) -> (z_q [B, D, T], codes
    [B, T, Q], loss)`` adapts either library."""

    def __init__(self, encoder, decoder, quantizer, quantize, lr: float):
        import torch

        self.encoder, self.decoder, self.quantizer, self.quantize = (
            encoder,
            decoder,
            quantizer,
            quantize,
        )
        modules = (encoder, decoder, quantizer)
        params = [p for m in modules for p in m.parameters()]
        self.optimizer = torch.optim.Adam(params, lr=lr)
        self.modules = modules

    def __call__(self, x):
        z_q, codes, qloss = self.quantize(self.encoder(x))
        return self.decoder(z_q), codes, qloss

    def train_step(self, x) -> float:
        import torch.nn.functional as F

        recon, _, qloss = self(x)
        loss = F.mse_loss(recon, x) + qloss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def evaluate(self, x, codebook_size: int) -> dict:
        import torch
        import torch.nn.functional as F

        for m in self.modules:
            m.eval()
        with torch.no_grad():
            recon, codes, _ = self(x)
        for m in self.modules:
            m.train()
        perplexity, used = usage(codes, codebook_size)
        return {"test MSE": float(F.mse_loss(recon, x)), "perplexity": perplexity, "used": used}


def vqvae(args, x_train, x_test) -> list[dict]:
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
    gen = torch.Generator().manual_seed(1)
    times: dict[str, list[float]] = {name: [] for name in models}
    first: dict[str, float] = {}
    losses: dict[str, float] = {}
    for step in range(args.steps):
        notes = torch.randint(x_train.shape[0], (args.batch,), generator=gen)
        starts = torch.randint(x_train.shape[2] - args.frames + 1, (args.batch,), generator=gen)
        crops = torch.stack(
            [x_train[i, :, s : s + args.frames] for i, s in zip(notes, starts, strict=True)]
        )
        order = list(models) if step % 2 == 0 else list(reversed(models))
        for name in order:
            start = time.perf_counter()
            losses[name] = models[name].train_step(crops)
            seconds = time.perf_counter() - start
            if step == 0:
                first[name] = seconds
            elif step >= min(5, args.steps - 1):  # after warm-up
                times[name].append(seconds)
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
    g.add_argument("--seed", type=int, default=0, help="part 3's seed (weights and batches)")
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
        micro = layer_step(args)
        columns = [
            "layer",
            "system",
            "best seconds",
            "median seconds",
            "vq / anchor",
            "first step seconds",
            "perplexity",
            "codes used",
        ]
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
        layers = vqvae_layers.run(args, *data)
        title = (
            f"VQ-VAE on NSynth log-mels with each issue-21 layer: {args.latent}-d latents, "
            f"{args.stages} stages of {args.codes} codes where staged, {args.steps} steps of "
            f"{args.batch} crops, same weights and batches (seed {args.seed})"
        )
        report("vqvae_nsynth_layers", title, args.threads, layers, vqvae_layers.COLUMNS)
        rows += layers
    return rows


if __name__ == "__main__":
    main()
