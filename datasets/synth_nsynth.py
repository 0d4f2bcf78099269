"""A synthesized stand-in for NSynth: notes from per-family timbre models, written in the
NSynth json/wav layout so that :class:`vq.datasets.NSynth` (and everything after it) runs
unchanged on it and on the real download.

Every instrument draws its own parameters from its family's model; the source varies the model
(acoustic: noise, jitter, inharmonicity, body resonances, some room reverb; electronic: cleaner,
FM or pickups; synthetic: plain saw/square/sine waves and filter sweeps). The models:

=========== ==============================================================================
bass        plucked string (decaying inharmonic partials) / filtered saw synth bass
brass       bright harmonics whose brightness rises through the attack, pitch scoop, formant
flute       near-sinusoid with breath noise and vibrato
guitar      plucked string, pluck-position comb, faster-decaying upper partials, distortion
keyboard    stretched piano partials with two-stage decay / FM electric piano / square synth
mallet      inharmonic bar partials (1, 2.76, 5.40, 8.93) with fast decay and a strike
organ       stationary drawbar harmonics, no decay, tremolo (Leslie) on some
reed        odd harmonics (clarinet) or a formant-shaped saxophone spectrum
string      saw-like spectrum, body resonances, slow attack, delayed vibrato, bow noise
synth_lead  FM, or detuned saw/square voices with a filter sweep, gating, drive
vocal       glottal harmonics shaped by three vowel formants, vibrato
=========== ==============================================================================

Velocity sets loudness and brightness; every note is held for 3 s and released over the last
second (4 s, 64,000 samples at 16 kHz, 16-bit PCM).
"""

from __future__ import annotations

import functools
import io
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from vq.datasets.nsynth import FAMILIES, NUM_SAMPLES, QUALITIES, SAMPLE_RATE, SOURCES, _soundfile

#: MIDI pitch range of each family's instruments (inside the piano's 21–108)
FAMILY_PITCH_RANGES: dict[str, tuple[int, int]] = {
    "bass": (21, 67),
    "brass": (40, 84),
    "flute": (60, 96),
    "guitar": (40, 88),
    "keyboard": (21, 108),
    "mallet": (53, 100),
    "organ": (36, 96),
    "reed": (46, 91),
    "string": (28, 100),
    "synth_lead": (36, 96),
    "vocal": (45, 84),
}
#: the sources each family's instruments cycle through (no acoustic synth lead)
_FAMILY_SOURCES = {f: (0, 1, 2) for f in FAMILIES} | {"synth_lead": (1, 2)}
#: split → block of instrument numbers, so that the splits of one root share no instrument
_SPLIT_BLOCKS = {None: 0, "train": 0, "valid": 1, "test": 2}
_NUMBERS_PER_BLOCK = 300  # instrument_str numbers: train 000–299, valid 300–599, test 600–899
_MAX_INSTRUMENTS = 11 * _NUMBERS_PER_BLOCK  # ≤ 300 per family, so numbers stay in the block

_T = np.arange(NUM_SAMPLES) / SAMPLE_RATE  # seconds, float64 [64000]
_HOLD_S = 3.0
_MAX_HZ = 7_600.0  # partials stay below Nyquist (8 kHz) with room for vibrato
_TABLE = 4096  # wavetable length
_BLOCK = 256  # samples per block in _partials (divides 64,000)
_MOD_STEP = 32  # pitch modulation is computed every 32 samples (2 ms)
_VOWELS = {  # F1, F2, F3 (Hz)
    "a": (730, 1090, 2440),
    "e": (530, 1840, 2480),
    "i": (270, 2290, 3010),
    "o": (570, 840, 2410),
    "u": (300, 870, 2240),
}


def synthesize_nsynth(
    root: str | os.PathLike,
    *,
    n_instruments: int = 33,
    split: str | None = None,
    seed: int = 0,
    pitches: Iterable[int] | None = None,
    velocities: Iterable[int] = (25, 50, 75, 100, 127),
    notes_per_instrument: int | None = 10,
    overwrite: bool = False,
    verbose: bool = False,
) -> Path:
    """Write an NSynth-format dataset of synthesized notes.

    Instrument ``i`` (0 ≤ i < n_instruments) belongs to family ``FAMILIES[i % 11]`` and cycles
    through that family's sources, so ``n_instruments >= 11`` covers every family (and 33 every
    family × source). Each instrument plays ``notes_per_instrument`` notes drawn (seeded, without
    repetition) from ``pitches × velocities``, pitches limited to its family's range
    (:data:`FAMILY_PITCH_RANGES`). The splits "train", "valid" and "test" number their
    instruments in disjoint blocks, so splits written into one root never share an instrument.

    Args:
        root: dataset directory; created if needed.
        n_instruments: instruments in total (1–3300).
        split: None writes ``<root>/examples.json``; "train", "valid" or "test" write
            ``<root>/<split>/``.
        seed: non-negative int; the same seed and arguments write identical bytes.
        pitches: MIDI pitches (21–108) to draw from; None: every pitch in the family's range.
        velocities: MIDI velocities (1–127) to draw from.
        notes_per_instrument: notes per instrument; None plays every pitch × velocity in range.
        overwrite: replace an existing examples.json (stale wav files are left in place).
        verbose: progress bar.

    Returns:
        The directory holding examples.json and audio/ (``root`` or ``root/split``): pass it to
        ``NSynth(path)``, or pass ``root`` and ``split`` to ``NSynth(root, split=split)``.

    Notes are 4 s of 16 kHz mono 16-bit PCM (128 kB on disk each); synthesis and writing take
    about 5 ms a note (3,000 notes in 15 s on two cores, 30 s when they are busy).
    """
    if split not in _SPLIT_BLOCKS:
        raise ValueError(f"split must be None, 'train', 'valid' or 'test', got {split!r}")
    if not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if isinstance(n_instruments, bool) or not isinstance(n_instruments, int | np.integer):
        raise TypeError(f"n_instruments must be an integer, got {n_instruments!r}")
    if not 1 <= n_instruments <= _MAX_INSTRUMENTS:
        raise ValueError(f"n_instruments must be in 1–{_MAX_INSTRUMENTS}, got {n_instruments}")
    pitch_set = _check_midi(pitches, 21, 108, "pitches") if pitches is not None else None
    velocity_set = _check_midi(velocities, 1, 127, "velocities")
    if notes_per_instrument is not None and (
        isinstance(notes_per_instrument, bool)
        or not isinstance(notes_per_instrument, int | np.integer)
        or notes_per_instrument < 1
    ):
        raise ValueError(f"notes_per_instrument must be >= 1 or None, got {notes_per_instrument}")

    block = _SPLIT_BLOCKS[split]
    directory = Path(root) / split if split is not None else Path(root)
    json_path = directory / "examples.json"
    if json_path.exists():
        if not overwrite:
            raise FileExistsError(
                f"{json_path} exists; pass overwrite=True to replace it, or another root/split"
            )
        json_path.unlink()  # an interrupted rewrite must not leave it pointing at new audio
    audio_dir = directory / "audio"
    audio_dir.mkdir(parents=True, exist_ok=True)

    instruments = _instruments(n_instruments, block, seed)
    plan = []  # (instrument, pitch, velocity)
    for inst in instruments:
        family = FAMILIES[inst["family"]]
        lo, hi = FAMILY_PITCH_RANGES[family]
        in_range = [p for p in (pitch_set or range(lo, hi + 1)) if lo <= p <= hi]
        if not in_range:
            raise ValueError(
                f"none of the pitches {pitch_set} lies in the {family} range {lo}–{hi}; "
                f"give pitches covering every family (e.g. 60 does)"
            )
        grid = [(p, v) for p in in_range for v in velocity_set]
        if notes_per_instrument is not None and notes_per_instrument < len(grid):
            rng = np.random.default_rng([seed, block, inst["index"], 1])
            pick = np.sort(rng.choice(len(grid), notes_per_instrument, replace=False))
            grid = [grid[j] for j in pick]
        plan += [(inst, p, v) for p, v in grid]
    plan.sort(key=lambda item: _note_str(item[0]["name"], item[1], item[2]))

    sf = _soundfile()
    examples = {}
    for note, (inst, pitch, velocity) in enumerate(
        tqdm(plan, desc=f"synthesize {split or 'nsynth'}", unit="note", disable=not verbose)
    ):
        note_str = _note_str(inst["name"], pitch, velocity)
        rng = np.random.default_rng([seed, block, inst["index"], 2, pitch, velocity])
        pcm = _to_pcm(_render_note(inst["params"], pitch, velocity, rng))
        wav = io.BytesIO()  # written in one go: soundfile syncs files to disk on close (slow)
        sf.write(wav, pcm, SAMPLE_RATE, subtype="PCM_16", format="WAV")
        (audio_dir / f"{note_str}.wav").write_bytes(wav.getvalue())
        examples[note_str] = {
            "note": block * 1_000_000 + note,
            "sample_rate": SAMPLE_RATE,
            "pitch": pitch,
            "instrument_source": inst["source"],
            "instrument_family_str": FAMILIES[inst["family"]],
            "instrument_str": inst["name"],
            "note_str": note_str,
            "qualities_str": [q for q, on in zip(QUALITIES, inst["qualities"], strict=True) if on],
            "instrument_source_str": SOURCES[inst["source"]],
            "velocity": velocity,
            "instrument_family": inst["family"],
            "instrument": inst["id"],
            "qualities": list(inst["qualities"]),
        }
    tmp = json_path.with_name(f".examples.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(examples), encoding="utf-8")
    os.replace(tmp, json_path)
    return directory


def _note_str(instrument_str: str, pitch: int, velocity: int) -> str:
    return f"{instrument_str}-{pitch:03d}-{velocity:03d}"


def _check_midi(values: Iterable[int], lo: int, hi: int, what: str) -> list[int]:
    given = list(values)
    out = sorted({int(v) for v in given})
    if not out or out[0] < lo or out[-1] > hi or any(int(v) != v for v in given):
        raise ValueError(
            f"{what} must be a non-empty set of MIDI numbers in {lo}–{hi}, got {given}"
        )
    return out


def _to_pcm(x: np.ndarray) -> np.ndarray:
    """float [-1, 1] → int16, refusing silence and non-finite values (a synthesis bug)."""
    peak = float(np.max(np.abs(x)))
    if not (np.isfinite(peak) and 0 < peak <= 1):
        raise RuntimeError(f"synthesized note has peak {peak}, expected (0, 1]")
    return np.round(x * 32767).astype(np.int16)


# -- instruments ----------------------------------------------------------------------------
def _instruments(n: int, block: int, seed: int) -> list[dict[str, Any]]:
    """Instrument i: family i % 11, a source of that family, parameters from its own seed."""
    counters: dict[tuple[int, int], int] = {}
    out = []
    for i in range(n):
        family, k = i % len(FAMILIES), i // len(FAMILIES)
        allowed = _FAMILY_SOURCES[FAMILIES[family]]
        source = allowed[(k + family) % len(allowed)]
        number = counters.get((family, source), 0)
        counters[family, source] = number + 1
        params = _draw(FAMILIES[family], SOURCES[source], np.random.default_rng([seed, block, i]))
        out.append(
            {
                "index": i,
                "family": family,
                "source": source,
                "id": block * 10_000 + i,
                "name": f"{FAMILIES[family]}_{SOURCES[source]}_"
                f"{block * _NUMBERS_PER_BLOCK + number:03d}",
                "params": params,
                "qualities": _qualities(params),
            }
        )
    return out


def _qualities(p: dict[str, Any]) -> tuple[int, ...]:
    """NSynth's quality indicators, read off the model's parameters."""
    on = {
        "bright": p["bright"] > 0.7,
        "dark": p["bright"] < 0.3,
        "distortion": p["drive"] > 0,
        "fast_decay": p["decay_s"] < 0.5,
        "long_release": p["release"] > 0.15 or p["reverb"] is not None,
        "multiphonic": len(p["detune"]) > 0,
        "nonlinear_env": p["tremolo"] is not None or p["gate"] is not None,
        "percussive": p["model"] in ("plucked", "mallet")
        or (p["attack"] < 0.006 and p["decay"] is not None and p["sustain"] < 0.3),
        "reverb": p["reverb"] is not None,
        "tempo-synced": p["gate"] is not None,
    }
    return tuple(int(on[q]) for q in QUALITIES)


def _draw(family: str, source: str, rng: np.random.Generator) -> dict[str, Any]:
    """One instrument's parameters from its family's model and its source."""
    u = rng.uniform
    bright = u()
    acoustic, synthetic = source == "acoustic", source == "synthetic"
    p: dict[str, Any] = {
        "model": "harmonic",
        "bright": bright,
        "rolloff": 1.0,  # harmonic h has amplitude h**-rolloff
        "even": 1.0,  # gain of the even harmonics
        "beta": u(0.3, 0.7),  # extra rolloff at velocity 0 (softer is darker)
        "formants": [],  # (centre Hz, bandwidth Hz, gain)
        "floor": 1.0,  # spectral weight outside the formants
        "drawbars": None,  # explicit harmonic levels {h: level}
        "two_stage": None,  # (fraction, time constant s) of a prompt first decay
        "attack": u(0.01, 0.03),
        "decay": None,  # amplitude decay time constant (s) towards `sustain`
        "sustain": 1.0,
        "decay_s": np.inf,  # effective decay time, for the fast_decay quality
        "vibrato": None,  # (rate Hz, depth, onset s)
        "jitter": u(0.0005, 0.002) if acoustic else 0.0,  # slow random pitch drift
        "scoop": 0.0,  # starts this much flat
        "sweep": None,  # (direction "down"/"up", cutoff Hz, time constant s)
        "detune": (),  # extra voices, relative detune
        "noise": None,  # (level, low Hz, high Hz): breath/bow noise under the envelope
        "strike": 0.0,  # level of a short broadband strike
        "drive": 0.0,
        "tremolo": None,  # (rate Hz, depth)
        "gate": None,  # rate Hz
        "reverb": None,  # (wet, time constant s, seed)
        "release": u(0.05, 0.2),
        "phases": rng.uniform(0, 2 * np.pi, 512) if acoustic else np.zeros(512),  # ≥ 7600/27.5
    }

    # Each family keeps its signature (envelope class, spectral shape) across sources; the
    # source changes the means: plucked string or filtered saw, piano or FM or square, ...
    if family in ("bass", "guitar") and not synthetic:
        low = family == "bass"
        p |= _plucked(
            rng,
            bright,
            acoustic,
            tau=(1.2, 2.5) if low else (0.4, 1.0),
            rolloff=(2.0, 1.4) if low else (1.4, 0.8),
            pluck=(0.2, 0.35) if low else (0.05, 0.15),
        )
        if not low and not acoustic and u() < 0.5:
            p["drive"] = u(2.0, 6.0)
    elif family in ("bass", "guitar"):
        low = family == "bass"
        p |= {
            "rolloff": 1.0,
            "even": rng.choice([0.0, 1.0]),  # square or saw
            "sweep": (
                "down",
                (u(150, 500) if low else u(800, 2000)) * (0.5 + bright),
                u(0.05, 0.3),
            ),
            "attack": u(0.002, 0.006),
            "decay": u(0.8, 1.6) if low else u(0.3, 0.7),
            "sustain": u(0.0, 0.15),
        }
        p["decay_s"] = p["decay"]
    elif family == "brass":  # bright, brightening through the attack, a formant near 1.2 kHz
        p |= {
            "rolloff": 0.7 - 0.3 * bright,
            "even": u(0.8, 1.0),
            "formants": [(u(900, 1500), u(400, 800), u(1.5, 3.0))],
            "sweep": ("up", u(300, 700), u(0.05, 0.15)),
            "attack": u(0.04, 0.1),
            "scoop": u(0.01, 0.03) if not synthetic else 0.0,
            "vibrato": (u(4.5, 6.0), u(0.002, 0.004), u(0.8, 1.5)),
            "noise": (u(0.01, 0.03), 500, 4000) if acoustic else None,
            "sustain": u(0.75, 0.95),
            "decay": u(0.5, 1.5),
        }
    elif family == "flute":  # near-sinusoid, breath noise, vibrato
        p |= {
            "rolloff": (3.8 - 1.0 * bright) if not synthetic else u(4.0, 6.0),
            "even": u(0.5, 1.0),
            "attack": u(0.08, 0.15),
            "vibrato": (u(4.5, 5.5), u(0.004, 0.008), u(0.2, 0.5)),
            "noise": (
                {"acoustic": u(0.08, 0.15), "electronic": u(0.04, 0.08)}.get(source, 0.03),
                1500,
                6000,
            ),
            "beta": u(0.2, 0.4),
        }
    elif family == "keyboard" and acoustic:  # piano: stretched partials, two-stage decay
        p |= _plucked(rng, bright, True, tau=(2.0, 4.0), rolloff=(1.6, 1.0), pluck=(1 / 9, 1 / 7))
        p |= {
            "inharmonicity": u(2e-4, 8e-4),
            "two_stage": (  # every keyboard has a prompt decay, then a slow one
                u(0.5, 0.8),
                u(0.15, 0.4),
            ),  # fraction and time constant of the prompt decay
            "beta": u(0.6, 1.0),
        }
    elif family == "keyboard" and not synthetic:  # FM electric piano
        r = [(1, 1), (1, 2), (1, 3), (2, 1)][rng.integers(4)]
        p |= {
            "model": "fm",
            "ratios": r,
            "index": u(1.0, 3.0) * (0.5 + bright),
            "index_decay": (u(0.1, 0.3), u(0.15, 0.6)),  # sustained fraction, time constant
            "attack": u(0.001, 0.004),
            "two_stage": (u(0.5, 0.8), u(0.1, 0.3)),
            "decay": u(2.0, 4.0),
            "sustain": 0.0,
            "tremolo": (u(4.0, 7.0), u(0.2, 0.4)) if u() < 0.4 else None,
        }
        p["decay_s"] = p["decay"]
    elif family == "keyboard":
        p |= {
            "rolloff": 1.0,
            "even": u(0.0, 0.3),
            "attack": u(0.002, 0.005),
            "two_stage": (u(0.5, 0.8), u(0.1, 0.3)),
            "decay": u(1.5, 3.0),
            "sustain": 0.0,
            "sweep": ("down", u(400, 1500) * (0.5 + bright), u(0.1, 0.4)),
        }
        p["decay_s"] = p["decay"]
    elif family == "mallet":  # inharmonic bar partials, fast decay, a strike
        ratios = {
            "acoustic": [1.0, 2.76, 5.40, 8.93, 13.34],
            "electronic": [1.0, 4.0, 10.0],  # tuned vibraphone bar
            "synthetic": [1.0, 2.76, 5.40],
        }[source]
        ratios = np.array(ratios) * (1 + rng.uniform(-0.02, 0.02, len(ratios)) * (not synthetic))
        ratios[0] = 1.0
        p |= {
            "model": "mallet",
            "ratios": ratios,
            "amps": 0.6 ** np.arange(len(ratios)) * rng.uniform(0.5, 1.0, len(ratios)),
            "tau": u(0.2, 0.6) if source != "electronic" else u(0.5, 1.0),
            "alpha": u(0.7, 1.2),
            "strike": u(0.05, 0.2) if acoustic else u(0.0, 0.03),
            "attack": 0.001,
            "tremolo": (u(4.0, 7.0), u(0.3, 0.6)) if source == "electronic" and u() < 0.5 else None,
        }
        p["decay_s"] = p["tau"]
    elif family == "organ":  # stationary sparse (drawbar / rank) harmonics, fast attack, no decay
        bars = {1: 1.0} | {h: u(0, 1) * (u() < 0.6) for h in (2, 3, 4, 6, 8, 10, 12, 16)}
        bars[rng.choice([2, 4])] = u(0.5, 1.0)  # an octave is always drawn
        bars[3] = max(bars[3], u(0.3, 1.0))  # and the twelfth (odd: kept when synthetic)
        if synthetic:
            bars = {h: lvl for h, lvl in bars.items() if h % 2 == 1 or h in (2, 4)}
        p |= {
            "drawbars": bars,
            "attack": u(0.005, 0.015) if not acoustic else u(0.02, 0.04),
            "release": u(0.03, 0.08),
            "beta": u(0.15, 0.4),  # the organ barely responds to velocity
            "detune": (u(0.001, 0.003),) if acoustic else (),  # a second rank, slightly off
            "noise": (u(0.005, 0.02), 300, 3000) if acoustic else None,
            "strike": u(0.01, 0.03) if source == "electronic" else 0.0,  # key click
            "tremolo": (u(5.5, 7.0), u(0.1, 0.25))
            if source == "electronic" and u() < 0.5
            else None,
        }
    elif family == "reed":  # odd harmonics dominate (clarinet-like bore)
        p |= {
            "rolloff": 1.6 - 0.4 * bright if not synthetic else 1.2,
            "even": u(0.05, 0.25) if not synthetic else u(0.0, 0.1),
            "formants": [(u(1000, 2000), u(300, 700), u(0.5, 1.5))] if u() < 0.5 else [],
            "attack": u(0.03, 0.06),
            "vibrato": (u(4.5, 6.0), u(0.001, 0.003), u(0.3, 0.8)),
            "noise": (u(0.02, 0.05), 1000, 5000) if acoustic else None,
        }
    elif family == "string":  # saw-like, body resonances, slow attack, vibrato, bow noise
        body = [(u(200, 600), u(80, 200), u(1, 3)), (u(800, 1500), u(150, 400), u(1, 3))]
        body += [(u(2000, 3500), u(300, 800), u(0.5, 2))]
        p |= {
            "rolloff": 1.2 - 0.3 * bright,
            "even": u(0.8, 1.0),
            "formants": body if not synthetic else [],
            "attack": u(0.2, 0.45),
            "vibrato": (u(5.0, 6.5), u(0.004, 0.008), u(0.2, 0.5)),
            "noise": (u(0.01, 0.03), 2000, 7000) if acoustic else None,
            "detune": (u(0.003, 0.007), -u(0.003, 0.007)) if synthetic else (),
        }
    elif family == "synth_lead" and source == "electronic":  # bright FM lead, a detuned voice
        r = [(1, 1), (1, 2), (2, 1), (1, 3)][rng.integers(4)]
        p |= {
            "model": "fm",
            "ratios": r,
            "index": u(2.5, 5.0) * (0.7 + 0.6 * bright),
            "index_decay": (u(0.6, 0.9), u(0.2, 0.6)),
            "detune": (u(0.003, 0.008),),
            "attack": u(0.005, 0.015),
            "sustain": 1.0,
            "drive": u(1.5, 4.0) if u() < 0.3 else 0.0,
        }
    elif family == "synth_lead":  # detuned saws/squares through a closing filter
        p |= {
            "rolloff": 1.0,
            "even": rng.choice([0.0, 1.0]),
            "detune": tuple(rng.choice([-1, 1], 2) * rng.uniform(0.003, 0.009, 2)),
            "sweep": ("down", u(1000, 3000) * (0.5 + bright), u(0.1, 0.4)),
            "attack": u(0.005, 0.015),
            "gate": float(rng.choice([4.0, 6.0, 8.0])) if u() < 0.3 else None,
            "drive": u(1.5, 4.0) if u() < 0.3 else 0.0,
        }
    else:  # vocal: glottal harmonics through three vowel formants, vibrato
        f1, f2, f3 = np.array(_VOWELS["aeiou"[rng.integers(5)]]) * u(0.9, 1.15)
        p |= {
            "rolloff": 1.3 - 0.4 * bright if not synthetic else 0.8,
            "formants": [(f1, u(60, 120), 1.0), (f2, u(80, 150), 0.6), (f3, u(100, 200), 0.35)],
            "floor": 0.02,
            "attack": u(0.08, 0.15),
            "vibrato": (u(4.8, 6.0), u(0.006, 0.012), u(0.2, 0.5)),
            "noise": (u(0.02, 0.05), 2000, 6000) if acoustic else None,
        }

    if acoustic and u() < 0.3:
        p["reverb"] = (u(0.15, 0.35), u(0.1, 0.3), int(rng.integers(2**31)))
    return p


def _plucked(
    rng: np.random.Generator,
    bright: float,
    acoustic: bool,
    *,
    tau: tuple[float, float],
    rolloff: tuple[float, float],
    pluck: tuple[float, float],
) -> dict[str, Any]:
    """Parameters of a plucked (or struck) string; ``rolloff`` is (darkest, brightest)."""
    u = rng.uniform
    p = {
        "model": "plucked",
        "rolloff": rolloff[0] + (rolloff[1] - rolloff[0]) * bright,
        "pluck": u(*pluck),  # pluck position along the string
        "pickup": None if acoustic else u(0.05, 0.25),  # magnetic pickup position
        "inharmonicity": u(3e-5, 3e-4) if acoustic else u(0.0, 3e-5),
        "tau": u(*tau) * (1.0 if acoustic else 1.5),  # decay of the fundamental at 110 Hz
        "tau_slope": u(0.1, 0.5),  # partial h decays 1 + tau_slope * (h - 1) times faster
        "strike": u(0.02, 0.06) if acoustic else u(0.0, 0.02),
        "attack": 0.002,
        "formants": [(u(90, 250), u(40, 100), u(0.5, 2.0)), (u(350, 700), u(100, 250), u(0.3, 1.5))]
        if acoustic
        else [],
    }
    p["decay_s"] = p["tau"] / (1 + p["tau_slope"])
    return p


# -- synthesis ------------------------------------------------------------------------------
def _render_note(p: dict[str, Any], pitch: int, velocity: int, rng: np.random.Generator):
    """One note of an instrument with parameters ``p``: float64 [64000], peak
    ``_loudness(velocity)`` ≤ 0.9; held for 3 s, released over the last second."""
    f0 = 440.0 * 2.0 ** ((pitch - 69) / 12)
    v = velocity / 127
    x, env = _MODELS[p["model"]](p, f0, v, rng)
    if p["two_stage"] is not None:
        frac, tau = p["two_stage"]
        prompt = (1 - frac) + frac * np.exp(-_T / tau)
        x, env = x * prompt, env * prompt
    if p["noise"] is not None:
        level, lo, hi = p["noise"]
        x = x + level * (0.3 + 0.7 * v) * env * _band_noise(rng, lo, hi)  # harder, breathier
    if p["strike"]:
        x = x + p["strike"] * (0.3 + 0.7 * v) * np.exp(-_T / 0.006) * _band_noise(rng, 1000, 7000)
    if p["drive"]:
        x = np.tanh(p["drive"] * (0.3 + 0.7 * v) * x / np.max(np.abs(x)))  # harder is dirtier
    if p["tremolo"] is not None:
        rate, depth = p["tremolo"]
        x = x * (1 - depth * (0.5 - 0.5 * np.cos(2 * np.pi * rate * _T)))
    if p["gate"] is not None:
        x = x * (0.1 + 0.9 * (0.5 + 0.5 * np.tanh(6 * np.sin(2 * np.pi * p["gate"] * _T))))
    if p["reverb"] is not None:
        x = _reverb(x, *p["reverb"])
    x = x * _release(p["release"])
    return x * (_loudness(v) / np.max(np.abs(x)))


def _loudness(v: float) -> float:
    """Peak level for a velocity in (0, 1]: 0.9 at 127, ~0.14 at 25 (about 16 dB softer)."""
    return 0.9 * (0.1 + 0.9 * v**1.7)


def _harmonic(p, f0, v, rng):
    """A wavetable of the instrument's harmonic spectrum (two, cross-faded, for a filter sweep),
    read at the note's instantaneous phase (vibrato, drift, scoop), plus detuned voices."""
    spread = 1 + max((abs(d) for d in p["detune"]), default=0) + 0.02
    amps = _harmonic_amps(p, f0, v, int(_MAX_HZ / (f0 * spread)))
    tables = [_table(amps, p["phases"])]
    if p["sweep"] is not None:
        direction, cutoff, tau = p["sweep"]
        h = np.arange(len(amps))
        dark = _table(amps * np.exp(-h * f0 / (cutoff * (0.5 + v))), p["phases"])
        mix = 1 - np.exp(-_T / tau)  # 0 → 1: from the first table to the second
        tables = [tables[0], dark] if direction == "down" else [dark, tables[0]]
    cycles = _cycles(f0, p, rng)
    x = np.zeros(NUM_SAMPLES)
    for ratio in (1.0, *(1 + d for d in p["detune"])):
        read = _lookup(tables, cycles * ratio)
        x += read[0] if len(read) == 1 else read[0] + mix * (read[1] - read[0])
    env = _envelope(p["attack"], p["decay"], p["sustain"])
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


def _table(amps: np.ndarray, phases: np.ndarray) -> np.ndarray:
    """One period of Σ a_h sin(2π h t + φ_h): float64 [_TABLE + 1] (wrapped), peak 1."""
    spec = np.zeros(_TABLE // 2 + 1, dtype=np.complex128)
    n = min(len(amps), len(phases), _TABLE // 2 - 1)
    spec[1 : n + 1] = amps[:n] * np.exp(1j * (phases[:n] - np.pi / 2)) * (_TABLE / 2)
    table = np.fft.irfft(spec, _TABLE)
    table /= np.max(np.abs(table))
    return np.append(table, table[0])


def _lookup(tables: list[np.ndarray], cycles: np.ndarray) -> list[np.ndarray]:
    pos = (cycles % 1.0) * _TABLE
    i = pos.astype(np.intp)
    frac = pos - i
    return [t[i] + frac * (t[i + 1] - t[i]) for t in tables]


def _cycles(f0: float, p, rng: np.random.Generator) -> np.ndarray:
    """Phase in cycles, float64 [64000]: f0 with vibrato, slow drift and an onset scoop (the
    modulation is slow, so it is computed every 2 ms and held)."""
    t = _T[::_MOD_STEP]
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
        return f0 * _T
    return np.cumsum(np.repeat(f0 * (1 + rel), _MOD_STEP)) / SAMPLE_RATE


def _plucked_model(p, f0, v, rng):
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
    x = _partials(freqs, a, taus, rng)
    env = np.exp(-_T / tau1)
    x *= np.minimum(_T / p["attack"], 1.0)
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
    x = _partials(freqs[keep], a, taus, rng)
    x *= np.minimum(_T / p["attack"], 1.0)
    return x / np.max(np.abs(x)), np.exp(-_T / tau0)


def _fm(p, f0, v, rng):
    """Two-operator FM: sin(2π c·φ + I(t) sin(2π m·φ)), φ the note's phase in cycles (one
    voice per detune); the index (brightness) follows velocity and decays towards a sustained
    fraction."""
    c, m = p["ratios"]
    f_top = f0 * (1.02 + max((abs(d) for d in p["detune"]), default=0))
    top = max(0.0, (_MAX_HZ - c * f_top) / (m * f_top) - 1)  # Carson's rule: below Nyquist
    index = min(p["index"] * (0.3 + 0.7 * v), top)
    keep, tau = p["index_decay"]
    index_t = index * (keep + (1 - keep) * np.exp(-_T / tau))
    cycles = _cycles(f0, p, rng)
    x = np.zeros(NUM_SAMPLES)
    for ratio in (1.0, *(1 + d for d in p["detune"])):
        phase = 2 * np.pi * cycles * ratio
        x += np.sin(c * phase + index_t * np.sin(m * phase))
    env = _envelope(p["attack"], p["decay"], p["sustain"])
    return x * env, env


_MODELS = {"harmonic": _harmonic, "plucked": _plucked_model, "mallet": _mallet, "fm": _fm}


def _partials(freqs, amps, taus, rng) -> np.ndarray:
    """Σ a_k exp(-t/τ_k) sin(2π f_k t + φ_k), float64 [64000].

    With z_k = exp(-1/(τ_k·sr) + 2πi f_k/sr), sample b·B + m of partial k is
    Im(a_k e^{iφ_k} z_k^{bB} · z_k^m): one complex matrix product [blocks × K] @ [K × B]."""
    log_z = -1 / (np.asarray(taus) * SAMPLE_RATE) + 2j * np.pi * np.asarray(freqs) / SAMPLE_RATE
    c = np.asarray(amps) * np.exp(1j * rng.uniform(0, 2 * np.pi, len(log_z)))
    starts = np.arange(0, NUM_SAMPLES, _BLOCK, dtype=np.float64)
    within = np.arange(_BLOCK, dtype=np.float64)
    blocks = c * np.exp(starts[:, None] * log_z)  # [blocks, K]
    steps = np.exp(within[:, None] * log_z).T  # [K, B]
    return (blocks @ steps).imag.ravel()


def _envelope(attack: float, decay: float | None, sustain: float) -> np.ndarray:
    """Smooth attack to 1, then exponential decay towards ``sustain`` (none if decay is None)."""
    a = np.minimum(_T / attack, 1.0)
    env = a * a * (3 - 2 * a)
    if decay is not None:
        env = env * (sustain + (1 - sustain) * np.exp(-np.maximum(_T - attack, 0) / decay))
    return env


def _release(tau: float) -> np.ndarray:
    """1 during the 3 s hold, then exponential release; the last 10 ms fade to exactly 0."""
    env = np.ones(NUM_SAMPLES)
    hold = int(_HOLD_S * SAMPLE_RATE)
    env[hold:] = np.exp(-(_T[hold:] - _HOLD_S) / tau)
    fade = int(0.01 * SAMPLE_RATE)
    env[-fade:] *= np.linspace(1, 0, fade)
    return env


def _band_noise(rng: np.random.Generator, lo: float, hi: float) -> np.ndarray:
    """Gaussian noise band-limited to [lo, hi] Hz: float64 [64000], unit RMS."""
    freqs = np.fft.rfftfreq(NUM_SAMPLES, 1 / SAMPLE_RATE)
    band = (freqs >= lo) & (freqs <= hi)
    spec = np.zeros(len(freqs), dtype=np.complex128)
    spec[band] = rng.standard_normal(band.sum()) + 1j * rng.standard_normal(band.sum())
    x = np.fft.irfft(spec, NUM_SAMPLES)
    return x / np.sqrt(np.mean(x**2))


_REVERB_FFT = 1 << 17  # ≥ 64,000 + the 0.8 s impulse response


def _reverb(x: np.ndarray, wet: float, tau: float, seed: int) -> np.ndarray:
    """A small room: convolution with exponentially decaying noise (the instrument's own)."""
    tail = np.fft.irfft(np.fft.rfft(x, _REVERB_FFT) * _room(tau, seed), _REVERB_FFT)
    return x + wet * tail[:NUM_SAMPLES]


@functools.lru_cache(maxsize=64)
def _room(tau: float, seed: int) -> np.ndarray:
    """Spectrum of a unit-energy impulse response: noise decaying with time constant tau."""
    n = int(0.8 * SAMPLE_RATE)
    ir = np.random.default_rng(seed).standard_normal(n) * np.exp(-_T[:n] / tau)
    return np.fft.rfft(ir / np.sqrt(np.sum(ir**2)), _REVERB_FFT)
