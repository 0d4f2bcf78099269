"""Rendering one note of the NSynth-format generator (:mod:`vq.datasets.synth_nsynth`).

An instrument's parameters (a dict from :func:`vq.datasets.synth_instruments.draw_instrument`)
name one of four sound models: ``harmonic`` (a wavetable of the harmonic spectrum, optionally
swept by a filter), ``plucked`` (decaying, slightly stretched string partials), ``mallet``
(inharmonic bar partials) or ``fm`` (two-operator FM). :func:`render_note` plays the model at a
pitch and velocity and adds what the parameters ask for on top: a prompt first decay, breath or
bow noise, a strike, drive, tremolo, gating, room reverb, and the release.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vq.datasets.nsynth import NUM_SAMPLES
from vq.datasets.synth_signals import (
    T,
    amplitude_envelope,
    band_noise,
    decaying_partials,
    phase_cycles,
    read_wavetables,
    release_envelope,
    reverb,
    wavetable,
)

_MAX_HZ = 7_600.0  # partials stay below Nyquist (8 kHz) with room for vibrato


def render_note(p: dict[str, Any], pitch: int, velocity: int, rng: np.random.Generator):
    """One note of an instrument with parameters ``p``: float64 [64000], peak
    ``_loudness(velocity)`` ≤ 0.9; held for 3 s, released over the last second."""
    f0 = 440.0 * 2.0 ** ((pitch - 69) / 12)
    v = velocity / 127
    x, env = _MODELS[p["model"]](p, f0, v, rng)
    if p["two_stage"] is not None:
        frac, tau = p["two_stage"]
        prompt = (1 - frac) + frac * np.exp(-T / tau)
        x, env = x * prompt, env * prompt
    if p["noise"] is not None:
        level, lo, hi = p["noise"]
        x = x + level * (0.3 + 0.7 * v) * env * band_noise(rng, lo, hi)  # harder, breathier
    if p["strike"]:
        x = x + p["strike"] * (0.3 + 0.7 * v) * np.exp(-T / 0.006) * band_noise(rng, 1000, 7000)
    if p["drive"]:
        x = np.tanh(p["drive"] * (0.3 + 0.7 * v) * x / np.max(np.abs(x)))  # harder is dirtier
    if p["tremolo"] is not None:
        rate, depth = p["tremolo"]
        x = x * (1 - depth * (0.5 - 0.5 * np.cos(2 * np.pi * rate * T)))
    if p["gate"] is not None:
        x = x * (0.1 + 0.9 * (0.5 + 0.5 * np.tanh(6 * np.sin(2 * np.pi * p["gate"] * T))))
    if p["reverb"] is not None:
        x = reverb(x, *p["reverb"])
    x = x * release_envelope(p["release"])
    return x * (_loudness(v) / np.max(np.abs(x)))


def _loudness(v: float) -> float:
    """Peak level for a velocity in (0, 1]: 0.9 at 127, ~0.14 at 25 (about 16 dB softer)."""
    return 0.9 * (0.1 + 0.9 * v**1.7)


# -- the sound models: (p, f0 Hz, velocity in (0, 1], rng) → (note, its envelope) -------------
def _harmonic(p, f0, v, rng):
    """A wavetable of the instrument's harmonic spectrum (two, cross-faded, for a filter sweep),
    read at the note's instantaneous phase (vibrato, drift, scoop), plus detuned voices."""
    spread = 1 + max((abs(d) for d in p["detune"]), default=0) + 0.02
    amps = _harmonic_amps(p, f0, v, int(_MAX_HZ / (f0 * spread)))
    tables = [wavetable(amps, p["phases"])]
    if p["sweep"] is not None:
        direction, cutoff, tau = p["sweep"]
        h = np.arange(len(amps))
        dark = wavetable(amps * np.exp(-h * f0 / (cutoff * (0.5 + v))), p["phases"])
        mix = 1 - np.exp(-T / tau)  # 0 → 1: from the first table to the second
        tables = [tables[0], dark] if direction == "down" else [dark, tables[0]]
    cycles = phase_cycles(f0, p, rng)
    x = np.zeros(NUM_SAMPLES)
    for ratio in (1.0, *(1 + d for d in p["detune"])):
        read = read_wavetables(tables, cycles * ratio)
        x += read[0] if len(read) == 1 else read[0] + mix * (read[1] - read[0])
    env = amplitude_envelope(p["attack"], p["decay"], p["sustain"])
    return x * env, env


def _harmonic_amps(p, f0: float, v: float, n: int) -> np.ndarray:
    """Amplitudes of harmonics 1..n (n ≥ 1): rolloff, odd/even balance, formants, and the
    velocity's brightness."""
    h = np.arange(1, max(n, 1) + 1, dtype=np.float64)
    if p["drawbars"] is not None:
        a = np.array([p["drawbars"].get(int(k), 0.0) for k in h])
    else:
        a = h ** -p["rolloff"]
        a[1::2] *= p["even"]
    a *= h ** (-p["beta"] * (1 - v))
    if p["formants"]:
        w = np.full(len(h), p["floor"])
        for centre, width, gain in p["formants"]:
            w += gain / (1 + ((h * f0 - centre) / width) ** 2)
        a *= w
    a[0] = max(a[0], 1e-3 * a.max())  # the fundamental is never absent
    return a


def _plucked(p, f0, v, rng):
    """Decaying, slightly stretched partials: pluck-position comb, upper partials fade first."""
    h = np.arange(1, 41, dtype=np.float64)
    freqs = f0 * h * np.sqrt(1 + p["inharmonicity"] * h**2)
    keep = freqs < _MAX_HZ
    keep[0] = True
    h, freqs = h[keep], freqs[keep]
    a = h ** -p["rolloff"] * (np.abs(np.sin(np.pi * h * p["pluck"])) + 0.05)
    if p["pickup"] is not None:
        a *= np.abs(np.sin(np.pi * h * p["pickup"])) + 0.05
    a *= h ** (-p["beta"] * (1 - v))
    for centre, width, gain in p["formants"]:
        a *= 1 + gain / (1 + ((freqs - centre) / width) ** 2)
    tau1 = p["tau"] * (f0 / 110) ** -0.4
    taus = tau1 / (1 + p["tau_slope"] * (h - 1))
    x = decaying_partials(freqs, a, taus, rng)
    env = np.exp(-T / tau1)
    x *= np.minimum(T / p["attack"], 1.0)
    return x / np.max(np.abs(x)), env


def _mallet(p, f0, v, rng):
    """Inharmonic bar partials, each decaying faster the higher it is; velocity lifts the upper
    ones."""
    freqs = f0 * p["ratios"]
    keep = freqs < _MAX_HZ
    keep[0] = True
    k = np.arange(len(freqs))[keep]
    a = p["amps"][keep] * (0.35 + 0.65 * v) ** (1.5 * k)
    tau0 = p["tau"] * (f0 / 440) ** -0.4
    taus = tau0 / p["ratios"][keep] ** p["alpha"]
    x = decaying_partials(freqs[keep], a, taus, rng)
    x *= np.minimum(T / p["attack"], 1.0)
    return x / np.max(np.abs(x)), np.exp(-T / tau0)


def _fm(p, f0, v, rng):
    """Two-operator FM: sin(2π c·φ + I(t) sin(2π m·φ)), φ the note's phase in cycles (one
    voice per detune); the index (brightness) follows velocity and decays towards a sustained
    fraction."""
    c, m = p["ratios"]
    f_top = f0 * (1.02 + max((abs(d) for d in p["detune"]), default=0))
    top = max(0.0, (_MAX_HZ - c * f_top) / (m * f_top) - 1)  # Carson's rule: below Nyquist
    index = min(p["index"] * (0.3 + 0.7 * v), top)
    keep, tau = p["index_decay"]
    index_t = index * (keep + (1 - keep) * np.exp(-T / tau))
    cycles = phase_cycles(f0, p, rng)
    x = np.zeros(NUM_SAMPLES)
    for ratio in (1.0, *(1 + d for d in p["detune"])):
        phase = 2 * np.pi * cycles * ratio
        x += np.sin(c * phase + index_t * np.sin(m * phase))
    env = amplitude_envelope(p["attack"], p["decay"], p["sustain"])
    return x * env, env


_MODELS = {"harmonic": _harmonic, "plucked": _plucked, "mallet": _mallet, "fm": _fm}
