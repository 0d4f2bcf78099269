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

This module plans the dataset (instruments, the notes each plays, their seeds) and writes it;
:mod:`~vq.datasets.synth_instruments` draws each instrument's parameters from its family's model,
:mod:`~vq.datasets.synth_render` plays a note of it, from the building blocks of
:mod:`~vq.datasets.synth_signals`.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from tqdm.auto import tqdm

from vq.datasets.nsynth import FAMILIES, QUALITIES, SAMPLE_RATE, SOURCES, _soundfile
from vq.datasets.synth_instruments import draw_instrument, instrument_qualities

# bound under this module's name, where synthesize_nsynth looks it up (a test replaces it here)
from vq.datasets.synth_render import render_note as _render_note
from vq.parallel.atomic import write_json

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


class _Instrument(NamedTuple):
    """One synthesized instrument: its NSynth metadata and its timbre model's parameters."""

    index: int  # i, 0 ≤ i < n_instruments: keys the instrument's and its notes' seeds
    family: int  # instrument_family (index into FAMILIES)
    source: int  # instrument_source (index into SOURCES)
    id: int  # instrument: block * 10,000 + index
    name: str  # instrument_str, e.g. "bass_acoustic_000"
    params: dict[str, Any]  # from draw_instrument, played by render_note
    qualities: tuple[int, ...]  # one 0/1 per entry of QUALITIES


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

    Notes are 4 s of 16 kHz mono 16-bit PCM (128 kB on disk each), synthesized and written one
    at a time (docs/perf/datasets.md has the measured rate).
    """
    pitch_set, velocity_set = _check_arguments(
        n_instruments, split, seed, pitches, velocities, notes_per_instrument
    )
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
    plan = _plan_notes(instruments, pitch_set, velocity_set, notes_per_instrument, block, seed)
    progress = tqdm(plan, desc=f"synthesize {split or 'nsynth'}", unit="note", disable=not verbose)
    examples = _write_notes(progress, audio_dir, block, seed)
    # last: examples.json only ever lists audio that was written
    write_json(json_path, examples, indent=None)
    return directory


def _check_arguments(
    n_instruments: int,
    split: str | None,
    seed: int,
    pitches: Iterable[int] | None,
    velocities: Iterable[int],
    notes_per_instrument: int | None,
) -> tuple[list[int] | None, list[int]]:
    """Check the arguments of :func:`synthesize_nsynth`; returns the sorted distinct pitches
    (None: every pitch of each family's range) and velocities."""
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
    return pitch_set, velocity_set


def _check_midi(values: Iterable[int], lo: int, hi: int, what: str) -> list[int]:
    given = list(values)
    out = sorted({int(v) for v in given})
    if not out or out[0] < lo or out[-1] > hi or any(int(v) != v for v in given):
        raise ValueError(
            f"{what} must be a non-empty set of MIDI numbers in {lo}–{hi}, got {given}"
        )
    return out


# -- instruments and the notes they play ------------------------------------------------------
def _instruments(n: int, block: int, seed: int) -> list[_Instrument]:
    """Instrument i: family i % 11, a source of that family, parameters from its own seed."""
    counters: dict[tuple[int, int], int] = {}
    out = []
    for i in range(n):
        family, k = i % len(FAMILIES), i // len(FAMILIES)
        allowed = _FAMILY_SOURCES[FAMILIES[family]]
        source = allowed[(k + family) % len(allowed)]
        number = counters.get((family, source), 0)
        counters[family, source] = number + 1
        rng = np.random.default_rng([seed, block, i])
        params = draw_instrument(FAMILIES[family], SOURCES[source], rng)
        out.append(
            _Instrument(
                index=i,
                family=family,
                source=source,
                id=block * 10_000 + i,
                name=f"{FAMILIES[family]}_{SOURCES[source]}_"
                f"{block * _NUMBERS_PER_BLOCK + number:03d}",
                params=params,
                qualities=instrument_qualities(params),
            )
        )
    return out


def _plan_notes(
    instruments: list[_Instrument],
    pitch_set: list[int] | None,
    velocity_set: list[int],
    notes_per_instrument: int | None,
    block: int,
    seed: int,
) -> list[tuple[_Instrument, int, int]]:
    """The notes to write, ``(instrument, pitch, velocity)`` in note_str order: for each
    instrument ``notes_per_instrument`` (None: all) of the pitch × velocity grid inside its
    family's range, drawn without repetition from a seed of its own."""
    plan = []
    for inst in instruments:
        family = FAMILIES[inst.family]
        lo, hi = FAMILY_PITCH_RANGES[family]
        in_range = [p for p in (pitch_set or range(lo, hi + 1)) if lo <= p <= hi]
        if not in_range:
            raise ValueError(
                f"none of the pitches {pitch_set} lies in the {family} range {lo}–{hi}; "
                f"give pitches covering every family (e.g. 60 does)"
            )
        grid = [(p, v) for p in in_range for v in velocity_set]
        if notes_per_instrument is not None and notes_per_instrument < len(grid):
            rng = np.random.default_rng([seed, block, inst.index, 1])
            pick = np.sort(rng.choice(len(grid), notes_per_instrument, replace=False))
            grid = [grid[j] for j in pick]
        plan += [(inst, p, v) for p, v in grid]
    plan.sort(key=lambda item: _note_str(item[0].name, item[1], item[2]))
    return plan


# -- writing ----------------------------------------------------------------------------------
def _write_notes(
    plan: Iterable[tuple[_Instrument, int, int]], audio_dir: Path, block: int, seed: int
) -> dict[str, dict[str, Any]]:
    """Render every planned note and write it to ``audio_dir/<note_str>.wav``; returns the
    contents of examples.json, {note_str: metadata} in plan order."""
    sf = _soundfile()
    examples = {}
    for note, (inst, pitch, velocity) in enumerate(plan):
        note_str = _note_str(inst.name, pitch, velocity)
        rng = np.random.default_rng([seed, block, inst.index, 2, pitch, velocity])
        pcm = _to_pcm(_render_note(inst.params, pitch, velocity, rng))
        wav = io.BytesIO()  # written in one go: soundfile syncs files to disk on close (slow)
        sf.write(wav, pcm, SAMPLE_RATE, subtype="PCM_16", format="WAV")
        (audio_dir / f"{note_str}.wav").write_bytes(wav.getvalue())
        examples[note_str] = _metadata(inst, pitch, velocity, block * 1_000_000 + note)
    return examples


def _metadata(inst: _Instrument, pitch: int, velocity: int, note: int) -> dict[str, Any]:
    """One note's entry of examples.json, its fields in NSynth's order."""
    note_str = _note_str(inst.name, pitch, velocity)
    return {
        "note": note,
        "sample_rate": SAMPLE_RATE,
        "pitch": pitch,
        "instrument_source": inst.source,
        "instrument_family_str": FAMILIES[inst.family],
        "instrument_str": inst.name,
        "note_str": note_str,
        "qualities_str": [q for q, on in zip(QUALITIES, inst.qualities, strict=True) if on],
        "instrument_source_str": SOURCES[inst.source],
        "velocity": velocity,
        "instrument_family": inst.family,
        "instrument": inst.id,
        "qualities": list(inst.qualities),
    }


def _note_str(instrument_str: str, pitch: int, velocity: int) -> str:
    return f"{instrument_str}-{pitch:03d}-{velocity:03d}"


def _to_pcm(x: np.ndarray) -> np.ndarray:
    """float [-1, 1] → int16, refusing silence and non-finite values (a synthesis bug)."""
    peak = float(np.max(np.abs(x)))
    if not (np.isfinite(peak) and 0 < peak <= 1):
        raise RuntimeError(f"synthesized note has peak {peak}, expected (0, 1]")
    return np.round(x * 32767).astype(np.int16)
