"""Audio embeddings for NSynth-style datasets, computed with torchaudio transforms.

Each note becomes one fixed-length vector: a log-mel (or MFCC) spectrogram summarised over time
by per-band statistics (mean and standard deviation), which keeps pitch, timbre and envelope
information in a form that Euclidean search can compare.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from vq._checks import check_int
from vq.parallel.atomic import atomic_path

METHODS = ("logmel", "mfcc")
#: bumped when the embedding computation changes, so that old cache files are not reused
_EMBED_VERSION = 1


def embedding_dim(method: str = "logmel", *, n_mels: int = 64, n_mfcc: int = 32) -> int:
    """Length of the vectors :func:`embed_nsynth` returns (mean and std per band)."""
    _check_method(method)
    return 2 * (n_mels if method == "logmel" else n_mfcc)


def embed_nsynth(
    dataset: Any,
    *,
    method: Literal["logmel", "mfcc"] = "logmel",
    sample_rate: int = 16_000,
    n_fft: int = 1024,
    hop_length: int = 256,
    n_mels: int = 64,
    n_mfcc: int = 32,
    batch_size: int = 64,
    cache_dir: str | os.PathLike | None = None,
    verbose: bool = False,
) -> np.ndarray:
    """Embed every note of ``dataset`` into one float32 vector.

    Args:
        dataset: indexable, ``dataset[i] -> (waveform, metadata)`` with waveform a float
            Tensor[T] (e.g. :class:`vq.datasets.NSynth`); every waveform has the same length.
        method: "logmel" (log of a mel spectrogram, ``n_mels`` bands) or "mfcc" (``n_mfcc``
            cepstral coefficients of that log-mel spectrogram).
        sample_rate, n_fft, hop_length, n_mels, n_mfcc: the transform's parameters.
        batch_size: notes transformed together.
        cache_dir: if given, embeddings are stored there (safetensors) under a key made of the
            dataset's notes (``dataset.note_strs`` and ``dataset.root`` when present) and every
            parameter above, and reused on the next call with the same key.
        verbose: progress bar.

    Returns:
        float32 ndarray [len(dataset), 2 * bands]: per band, the mean then the standard
        deviation over time of the log-mel (or MFCC) values.
    """
    _check_method(method)
    for arg, value in (
        ("sample_rate", sample_rate),
        ("n_fft", n_fft),
        ("hop_length", hop_length),
        ("n_mels", n_mels),
        ("n_mfcc", n_mfcc),
        ("batch_size", batch_size),
    ):
        check_int(value, arg, 1)
    if method == "mfcc" and n_mfcc > n_mels:
        raise ValueError(f"n_mfcc ({n_mfcc}) cannot exceed n_mels ({n_mels})")
    config = {
        "version": _EMBED_VERSION,
        "method": method,
        "sample_rate": sample_rate,
        "n_fft": n_fft,
        "hop_length": hop_length,
        "n_mels": n_mels,
        "n_mfcc": n_mfcc,
    }
    cache = _cache_path(dataset, config, cache_dir) if cache_dir is not None else None
    if cache is not None and cache.exists():
        cached = _read_cache(cache, len(dataset))
        if cached is not None:
            return cached
    transform = _transform(config)
    out = np.empty((len(dataset), embedding_dim(method, n_mels=n_mels, n_mfcc=n_mfcc)), np.float32)
    with (
        torch.no_grad(),
        tqdm(total=len(dataset), desc=f"embed ({method})", disable=not verbose, unit="note") as bar,
    ):
        for start in range(0, len(dataset), batch_size):
            stop = min(len(dataset), start + batch_size)
            waves = _stack([dataset[i][0] for i in range(start, stop)], start)
            out[start:stop] = _summarise(transform(waves), method).numpy()
            bar.update(stop - start)
    if cache is not None:
        _write_cache(cache, out, config)
    return out


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def _transform(config: dict) -> torch.nn.Module:
    import torchaudio.transforms as T

    mel = {
        "n_fft": config["n_fft"],
        "hop_length": config["hop_length"],
        "n_mels": config["n_mels"],
    }
    if config["method"] == "mfcc":
        return T.MFCC(
            sample_rate=config["sample_rate"], n_mfcc=config["n_mfcc"], log_mels=True, melkwargs=mel
        )
    return T.MelSpectrogram(sample_rate=config["sample_rate"], **mel)


def _stack(waves: Sequence[torch.Tensor], start: int) -> torch.Tensor:
    waves = [torch.as_tensor(w) for w in waves]
    lengths = {int(w.shape[-1]) if w.dim() else 0 for w in waves}
    if len(lengths) != 1 or any(w.dim() != 1 for w in waves):
        shapes = sorted({tuple(w.shape) for w in waves})
        raise ValueError(
            f"notes {start}…{start + len(waves) - 1}: expected mono waveforms of one length, "
            f"got shapes {shapes}"
        )
    for i, w in enumerate(waves):
        if not w.is_floating_point():
            raise TypeError(
                f"note {start + i}: expected a float waveform in [-1, 1], got {w.dtype} "
                "(scale integer PCM, e.g. int16 / 32768)"
            )
    batch = torch.stack([w.float() for w in waves])
    finite = torch.isfinite(batch).all(dim=1)
    if not bool(finite.all()):
        first = start + int(torch.argmin(finite.to(torch.uint8)))
        raise ValueError(f"note {first}: its waveform holds NaN/Inf samples")
    return batch


def _summarise(spec: torch.Tensor, method: str) -> torch.Tensor:
    """[B, bands, frames] → [B, 2 * bands]: per-band mean and std over time."""
    if method == "logmel":
        spec = torch.log(spec + 1e-6)
    return torch.cat([spec.mean(dim=-1), spec.std(dim=-1)], dim=1).float()


def _cache_path(dataset: Any, config: dict, cache_dir) -> Path:
    h = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    root = getattr(dataset, "root", None)
    h.update(str(Path(root).resolve() if root is not None else "").encode())
    names = getattr(dataset, "note_strs", None)
    if names is None:
        raise ValueError(
            "cache_dir needs a dataset with a note_strs attribute (its notes name the cache); "
            "pass cache_dir=None for other datasets"
        )
    for name in names:
        h.update(name.encode() + b"\0")
    return Path(cache_dir) / f"embeddings-{config['method']}-{h.hexdigest()[:20]}.safetensors"


def _read_cache(path: Path, n: int) -> np.ndarray | None:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        x = load_file(str(path))["embeddings"]
    except (SafetensorError, KeyError, OSError):
        return None  # unreadable: recompute and overwrite
    ok = x.ndim == 2 and x.shape[0] == n and x.dtype == np.float32 and np.isfinite(x).all()
    return x if ok else None  # a stale or damaged cache is recomputed


def _write_cache(path: Path, x: np.ndarray, config: dict) -> None:
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file({"embeddings": x}, str(tmp), metadata={"config": json.dumps(config)})
