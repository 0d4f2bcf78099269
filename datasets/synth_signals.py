"""Signal building blocks of the NSynth-format generator (:mod:`vq.datasets.synth_nsynth`).

Every signal here is one note long: float64 [64000], 4 s at 16 kHz, on the time grid :data:`T`.
Wavetables (one period of a harmonic spectrum, read at an instantaneous phase), a bank of decaying
sinusoids, envelopes, band-limited noise and a small room reverb. The functions that draw random
numbers take the note's generator ``rng`` and draw in a fixed order, so a seed fixes every sample.
"""

from __future__ import annotations

import functools

import numpy as np

from vq.datasets.nsynth import NUM_SAMPLES, SAMPLE_RATE

T = np.arange(NUM_SAMPLES) / SAMPLE_RATE  # seconds, float64 [64000]: the time of every sample
_HOLD_S = 3.0  # every note is held this long, then released
_TABLE = 4096  # wavetable length
_BLOCK = 256  # samples per block in decaying_partials (divides 64,000)
_MOD_STEP = 32  # pitch modulation is computed every 32 samples (2 ms)
_REVERB_FFT = 1 << 17  # ≥ 64,000 + the 0.8 s impulse response


# -- wavetables and phase ---------------------------------------------------------------------
def wavetable(amps: np.ndarray, phases: np.ndarray) -> np.ndarray:
    """One period of Σ a_h sin(2π h t + φ_h): float64 [_TABLE + 1] (wrapped), peak 1."""
    spec = np.zeros(_TABLE // 2 + 1, dtype=np.complex128)
    n = min(len(amps), len(phases), _TABLE // 2 - 1)
    spec[1 : n + 1] = amps[:n] * np.exp(1j * (phases[:n] - np.pi / 2)) * (_TABLE / 2)
    out = np.fft.irfft(spec, _TABLE)
    out /= np.max(np.abs(out))
    return np.append(out, out[0])


def read_wavetables(tables: list[np.ndarray], cycles: np.ndarray) -> list[np.ndarray]:
    """Each of ``tables`` (from :func:`wavetable`) read at phase ``cycles`` (float64 [64000], in
    cycles), interpolated linearly: a list of float64 [64000], one per table."""
    pos = (cycles % 1.0) * _TABLE
    i = pos.astype(np.intp)
    frac = pos - i
    return [t[i] + frac * (t[i + 1] - t[i]) for t in tables]


def phase_cycles(f0: float, p, rng: np.random.Generator) -> np.ndarray:
    """Phase in cycles, float64 [64000]: f0 with vibrato, slow drift and an onset scoop (the
    modulation is slow, so it is computed every 2 ms and held). ``p``: the instrument's
    parameters (``vibrato``, ``jitter``, ``scoop`` are read)."""
    t = T[::_MOD_STEP]
    rel = np.zeros(len(t))
    if p["vibrato"] is not None:
        rate, depth, onset = p["vibrato"]
        phi = rng.uniform(0, 2 * np.pi)
        rel += depth * (1 - np.exp(-t / onset)) * np.sin(2 * np.pi * rate * t + phi)
    if p["jitter"]:
        for r, phi in zip(rng.uniform(0.2, 3.0, 3), rng.uniform(0, 2 * np.pi, 3), strict=True):
            rel += p["jitter"] / np.sqrt(3) * np.sin(2 * np.pi * r * t + phi)
    if p["scoop"]:
        rel -= p["scoop"] * np.exp(-t / 0.05)
    if not rel.any():
        return f0 * T
    return np.cumsum(np.repeat(f0 * (1 + rel), _MOD_STEP)) / SAMPLE_RATE


# -- decaying partials ------------------------------------------------------------------------
def decaying_partials(freqs, amps, taus, rng) -> np.ndarray:
    """Σ a_k exp(-t/τ_k) sin(2π f_k t + φ_k), float64 [64000], for K partials of frequencies
    ``freqs`` (Hz), amplitudes ``amps`` and decay times ``taus`` (s), each [K]; the phases φ_k
    are drawn from ``rng``.

    With z_k = exp(-1/(τ_k·sr) + 2πi f_k/sr), sample b·B + m of partial k is
    Im(a_k e^{iφ_k} z_k^{bB} · z_k^m): one complex matrix product [blocks × K] @ [K × B]."""
    log_z = -1 / (np.asarray(taus) * SAMPLE_RATE) + 2j * np.pi * np.asarray(freqs) / SAMPLE_RATE
    c = np.asarray(amps) * np.exp(1j * rng.uniform(0, 2 * np.pi, len(log_z)))
    starts = np.arange(0, NUM_SAMPLES, _BLOCK, dtype=np.float64)
    within = np.arange(_BLOCK, dtype=np.float64)
    blocks = c * np.exp(starts[:, None] * log_z)  # [blocks, K]
    steps = np.exp(within[:, None] * log_z).T  # [K, B]
    return (blocks @ steps).imag.ravel()


# -- envelopes --------------------------------------------------------------------------------
def amplitude_envelope(attack: float, decay: float | None, sustain: float) -> np.ndarray:
    """Smooth attack to 1, then exponential decay towards ``sustain`` (none if decay is None)."""
    a = np.minimum(T / attack, 1.0)
    env = a * a * (3 - 2 * a)
    if decay is not None:
        env = env * (sustain + (1 - sustain) * np.exp(-np.maximum(T - attack, 0) / decay))
    return env


def release_envelope(tau: float) -> np.ndarray:
    """1 during the 3 s hold, then exponential release; the last 10 ms fade to exactly 0."""
    env = np.ones(NUM_SAMPLES)
    hold = int(_HOLD_S * SAMPLE_RATE)
    env[hold:] = np.exp(-(T[hold:] - _HOLD_S) / tau)
    fade = int(0.01 * SAMPLE_RATE)
    env[-fade:] *= np.linspace(1, 0, fade)
    return env


# -- noise and room ---------------------------------------------------------------------------
def band_noise(rng: np.random.Generator, lo: float, hi: float) -> np.ndarray:
    """Gaussian noise band-limited to [lo, hi] Hz: float64 [64000], unit RMS."""
    freqs = np.fft.rfftfreq(NUM_SAMPLES, 1 / SAMPLE_RATE)
    band = (freqs >= lo) & (freqs <= hi)
    spec = np.zeros(len(freqs), dtype=np.complex128)
    spec[band] = rng.standard_normal(band.sum()) + 1j * rng.standard_normal(band.sum())
    x = np.fft.irfft(spec, NUM_SAMPLES)
    return x / np.sqrt(np.mean(x**2))


def reverb(x: np.ndarray, wet: float, tau: float, seed: int) -> np.ndarray:
    """A small room: convolution with exponentially decaying noise (the instrument's own)."""
    tail = np.fft.irfft(np.fft.rfft(x, _REVERB_FFT) * _room(tau, seed), _REVERB_FFT)
    return x + wet * tail[:NUM_SAMPLES]


@functools.lru_cache(maxsize=64)
def _room(tau: float, seed: int) -> np.ndarray:
    """Spectrum of a unit-energy impulse response: noise decaying with time constant tau."""
    n = int(0.8 * SAMPLE_RATE)
    ir = np.random.default_rng(seed).standard_normal(n) * np.exp(-T[:n] / tau)
    return np.fft.rfft(ir / np.sqrt(np.sum(ir**2)), _REVERB_FFT)
