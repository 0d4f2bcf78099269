"""The VQ-VAE that bench.vqvae_nsynth trains (parts 2 and 3): NSynth log-mel spectrograms, a
small Conv1d encoder/decoder, one model per system around either library's quantizer, and the
loop that trains the systems alternately, step for step, on the same crops.
"""

from __future__ import annotations

import time
from pathlib import Path


def usage(codes, codebook_size: int) -> tuple[float, float]:
    """Perplexity and fraction of codes used, averaged over the codebooks of ``codes``
    (integer Tensor[..., Q] for Q stages, or [...] for one codebook)."""
    import torch

    from vq.quantizers.functional import usage_statistics

    c = codes.long().reshape(-1, codes.shape[-1] if codes.dim() > 2 else 1)
    counts = torch.stack([torch.bincount(col, minlength=codebook_size) for col in c.T])
    perplexity, used = usage_statistics(counts.float())
    return float(perplexity.mean()), float(used.mean())


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

        self.encoder, self.decoder, self.quantizer = encoder, decoder, quantizer
        self.quantize = quantize
        self.modules = (encoder, decoder, quantizer)
        params = [p for m in self.modules for p in m.parameters()]
        self.optimizer = torch.optim.Adam(params, lr=lr)

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
        """Test reconstruction MSE, perplexity and fraction of codes used on ``x`` (eval mode)."""
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


def train_alternately(models: dict, x_train, args, seed: int) -> dict:
    """Train ``models`` (name → :class:`VQVAE`) for ``args.steps`` steps of ``args.batch``
    random crops of ``args.frames`` frames, the same crops for every model (drawn from
    ``seed``), the models taking turns (A B, then B A) within each step. Each model draws
    from its own copy of torch's global random stream (k-means seeding, dead-code restarts,
    anything a layer samples), started from ``seed``: what one model samples never shifts
    another's draws, however many models train beside it.

    Returns:
        ``{"times": name → seconds of the steps after warm-up, "first": name → seconds of step
        0, "loss": name → the last training loss}``.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    streams = {name: torch.Generator().manual_seed(seed).get_state() for name in models}
    times: dict[str, list[float]] = {name: [] for name in models}
    first: dict[str, float] = {}
    losses: dict[str, float] = {}
    for step in range(args.steps):
        notes = torch.randint(x_train.shape[0], (args.batch,), generator=gen)
        starts = torch.randint(x_train.shape[2] - args.frames + 1, (args.batch,), generator=gen)
        crops = torch.stack(
            [x_train[i, :, s : s + args.frames] for i, s in zip(notes, starts, strict=True)]
        )
        for name in models if step % 2 == 0 else reversed(models):
            torch.set_rng_state(streams[name])
            start = time.perf_counter()
            losses[name] = models[name].train_step(crops)
            seconds = time.perf_counter() - start
            streams[name] = torch.get_rng_state()
            if step == 0:
                first[name] = seconds
            if step >= min(5, args.steps - 1):  # after warm-up
                times[name].append(seconds)
    return {"times": times, "first": first, "loss": losses}
