"""The NSynth dataset (Engel et al., "Neural Audio Synthesis of Musical Notes with WaveNet
Autoencoders", ICML 2017) in its json/wav layout, as a ``torch.utils.data.Dataset``.

Layout (one directory per split; ``nsynth-train/`` etc. in the official download)::

    <root>/[<split>/]examples.json          {note_str: metadata, ...}
    <root>/[<split>/]audio/<note_str>.wav   16 kHz mono 16-bit PCM, 4 s = 64,000 samples

Metadata is validated when the dataset is built; audio is read (and checked) per item, since the
full dataset holds ~300k notes. :func:`vq.datasets.synthesize_nsynth` writes a set of synthesized
notes in the same layout.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

#: instrument_family index → name
FAMILIES = (
    "bass",
    "brass",
    "flute",
    "guitar",
    "keyboard",
    "mallet",
    "organ",
    "reed",
    "string",
    "synth_lead",
    "vocal",
)
#: instrument_source index → name
SOURCES = ("acoustic", "electronic", "synthetic")
#: the ten note qualities, in the order of the ``qualities`` indicator list
QUALITIES = (
    "bright",
    "dark",
    "distortion",
    "fast_decay",
    "long_release",
    "multiphonic",
    "nonlinear_env",
    "percussive",
    "reverb",
    "tempo-synced",
)
SAMPLE_RATE = 16_000
NUM_SAMPLES = 64_000  # 4 s

_INT_FIELDS = (
    "note",
    "sample_rate",
    "pitch",
    "velocity",
    "instrument",
    "instrument_family",
    "instrument_source",
)
_STR_FIELDS = ("note_str", "instrument_str", "instrument_family_str", "instrument_source_str")
#: every metadata field of a note, as in the official examples.json
FIELDS = _INT_FIELDS + _STR_FIELDS + ("qualities", "qualities_str")
_FIELD_SET = frozenset(FIELDS)


class NSynth(Dataset):
    """NSynth notes: ``dataset[i] -> (waveform, metadata)``, ordered by ``note_str``.

    Args:
        root: the dataset directory (or the parent of the split directories).
        split: None reads ``<root>/examples.json``; "train" reads ``<root>/train/examples.json``,
            or ``<root>/nsynth-train/examples.json`` (the official archives' directory names)
            when there is no ``train/``; any sub-directory name works.
        families: keep only these instrument families: names ("bass", ...) or indices (0–10),
            one or several; None keeps all.
        sources: keep only these sources: "acoustic"/"electronic"/"synthetic" or 0–2.
        pitch_range: ``(lo, hi)`` MIDI pitches, inclusive; None keeps all.

    Items:
        waveform: float32 Tensor[64000] in [-1, 1] (4 s at 16 kHz).
        metadata: dict with every NSynth field (:data:`FIELDS`): ints as int, ``qualities`` a
            list of 10 ints (0/1), ``qualities_str`` a list of names, the rest str.

    Raises:
        FileNotFoundError: no examples.json (at construction) or a missing wav (per item).
        ValueError: malformed metadata (at construction), bad filters, or a wav that is not
            16 kHz mono with 64,000 samples (per item).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        split: str | None = None,
        families: str | int | Iterable[str | int] | None = None,
        sources: str | int | Iterable[str | int] | None = None,
        pitch_range: tuple[int, int] | None = None,
    ) -> None:
        self.root = Path(root)
        self.split = split
        self.directory = _split_directory(self.root, split)
        self.json_path = self.directory / "examples.json"
        self.audio_dir = self.directory / "audio"
        keep_families = _as_indices(families, FAMILIES, "instrument family")
        keep_sources = _as_indices(sources, SOURCES, "instrument source")
        lo, hi = _check_pitch_range(pitch_range)
        with _no_gc():  # the train split makes ~600k small objects for the collector to walk
            notes = _read_examples(self.json_path, self.root, split)
        self.metadata: list[dict[str, Any]] = [
            m
            for _, m in sorted(notes.items())
            if (keep_families is None or m["instrument_family"] in keep_families)
            and (keep_sources is None or m["instrument_source"] in keep_sources)
            and lo <= m["pitch"] <= hi
        ]
        self.note_strs: list[str] = [m["note_str"] for m in self.metadata]

    def __len__(self) -> int:
        return len(self.metadata)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        meta = self.metadata[index]
        waveform = read_nsynth_wav(self.audio_path(index))
        return torch.from_numpy(waveform), _copy(meta)

    def __repr__(self) -> str:
        return f"NSynth({str(self.directory)!r}, notes={len(self)})"

    def audio_path(self, index: int) -> Path:
        """The wav file of item ``index``."""
        return self.audio_dir / f"{self.metadata[index]['note_str']}.wav"

    def labels(self, field: str = "instrument_family") -> np.ndarray:
        """An integer field for every item: int64 [len(self)] (e.g. "instrument_family",
        "pitch", "instrument"), or int64 [len(self), 10] for "qualities"."""
        if field == "qualities":
            return np.array([m[field] for m in self.metadata], dtype=np.int64).reshape(-1, 10)
        if field not in _INT_FIELDS:
            raise ValueError(
                f"labels() takes an integer field, one of {_INT_FIELDS + ('qualities',)}; "
                f"got {field!r}"
            )
        return np.array([m[field] for m in self.metadata], dtype=np.int64)


def _split_directory(root: Path, split: str | None) -> Path:
    if split is None:
        return root
    official = root / f"nsynth-{split}"
    if not (root / split).is_dir() and (official / "examples.json").is_file():
        return official
    return root / split


def read_nsynth_wav(path: str | os.PathLike) -> np.ndarray:
    """One NSynth note: float32 [64000] in [-1, 1], checked to be 16 kHz mono, 64,000 samples."""
    sf = _soundfile()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: audio file is missing; every note in examples.json needs "
            f"audio/<note_str>.wav next to it"
        )
    try:
        f = sf.SoundFile(path)
    except sf.SoundFileError as err:
        raise ValueError(f"{path}: not a readable WAV file ({err})") from err
    with f:
        if f.samplerate != SAMPLE_RATE:
            raise ValueError(
                f"{path}: expected {SAMPLE_RATE} Hz audio, got {f.samplerate} Hz; "
                f"resample it to 16 kHz"
            )
        if f.channels != 1:
            raise ValueError(f"{path}: expected mono audio, got {f.channels} channels")
        data = f.read(NUM_SAMPLES + 1, dtype="float32")  # the header may promise more
    if len(data) != NUM_SAMPLES:
        what = "truncated" if len(data) < NUM_SAMPLES else "too long"
        raise ValueError(
            f"{path}: {what}: expected {NUM_SAMPLES} samples (4 s at 16 kHz), got {len(data)}"
        )
    return data


@contextlib.contextmanager
def _no_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _soundfile():
    try:
        import soundfile
    except ImportError as err:
        raise ImportError("reading NSynth audio needs soundfile: pip install 'vq[audio]'") from err
    return soundfile


def _copy(meta: dict[str, Any]) -> dict[str, Any]:
    out = dict(meta)
    out["qualities"] = list(meta["qualities"])
    out["qualities_str"] = list(meta["qualities_str"])
    return out


def _read_examples(path: Path, root: Path, split: str | None) -> dict[str, dict[str, Any]]:
    """examples.json → {note_str: metadata}, every note validated and normalised."""
    if not path.is_file():
        splits = sorted(
            p.name
            for p in (root.iterdir() if root.is_dir() else ())
            if (p / "examples.json").is_file()
        )
        hint = f" {root} has split directories {splits}: pass one as split." if splits else ""
        raise FileNotFoundError(
            f"{path} not found. Expected the NSynth layout <root>/[<split>/]examples.json with "
            f"audio in <root>/[<split>/]audio/<note_str>.wav.{hint} Without a download, "
            f"vq.datasets.synthesize_nsynth(root, split=...) generates a dataset in this layout."
        )
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err}); re-download or regenerate it") from err
    if not isinstance(raw, dict):
        raise ValueError(
            f"{path}: expected a JSON object mapping note_str to metadata, "
            f"got a {type(raw).__name__}"
        )
    notes = {}
    for key, meta in raw.items():
        try:
            notes[key] = _check_note(key, meta)
        except _BadNote as err:
            raise ValueError(f"{path}: note {key!r}: {err}") from None
    return notes


class _BadNote(ValueError):
    """A note's metadata is malformed (the caller adds the file and the note)."""


def _check_note(key: str, meta: Any) -> dict[str, Any]:
    """One note's metadata, checked and normalised (ints as int, lists copied)."""
    if not isinstance(meta, dict):
        raise _BadNote(f"expected an object of metadata, got {type(meta).__name__}")
    if not _FIELD_SET <= meta.keys():
        missing = [f for f in FIELDS if f not in meta]
        raise _BadNote(f"missing field(s) {missing}; NSynth notes have {list(FIELDS)}")
    out = dict(meta)
    for field in _INT_FIELDS:
        if type(meta[field]) is not int:  # the common case costs one check
            out[field] = _as_int(meta[field], f"field {field!r}")
    for field in _STR_FIELDS:
        if not isinstance(meta[field], str):
            raise _BadNote(f"field {field!r} should be a string, got {meta[field]!r}")
    q = meta["qualities"]
    if not isinstance(q, list) or len(q) != len(QUALITIES):
        raise _BadNote(f"'qualities' should be a list of {len(QUALITIES)} 0/1, got {q!r}")
    if not set(map(type, q)) <= {int}:  # set(map(...)) runs in C: ~300k notes in the train split
        q = [_as_int(v, "'qualities'") for v in q]
    if not set(q) <= {0, 1}:
        raise _BadNote(f"'qualities' should be a list of {len(QUALITIES)} 0/1, got {q!r}")
    out["qualities"] = list(q)
    qs = meta["qualities_str"]
    if not isinstance(qs, list) or not set(map(type, qs)) <= {str}:
        raise _BadNote(f"'qualities_str' should be a list of names, got {qs!r}")
    out["qualities_str"] = list(qs)
    if out["note_str"] != key:
        raise _BadNote(f"note_str is {out['note_str']!r}, expected the key {key!r}")
    for index, name, names in (
        ("instrument_family", "instrument_family_str", FAMILIES),
        ("instrument_source", "instrument_source_str", SOURCES),
    ):
        i = out[index]
        if not 0 <= i < len(names) or names[i] != out[name]:
            raise _BadNote(
                f"{index}={i} and {name}={out[name]!r} disagree (expected indices into {names})"
            )
    for field in ("pitch", "velocity"):
        if not 0 <= out[field] <= 127:
            raise _BadNote(f"{field} {out[field]} is outside MIDI 0–127")
    return out


def _as_int(value: Any, what: str) -> int:
    """An int, or a float holding an integer (22.0); anything else is an error."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BadNote(f"{what} should be an integer, got {value!r}")
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise _BadNote(f"{what} should be an integer, got {value!r}")
        return int(value)
    return value


def _as_indices(
    values: str | int | Iterable[str | int] | None, names: tuple[str, ...], what: str
) -> frozenset[int] | None:
    """Filter values (names or indices, one or several) → a set of indices; None → None."""
    if values is None:
        return None
    if isinstance(values, str | int | np.integer):
        values = [values]
    out = set()
    for v in values:
        if isinstance(v, str):
            if v not in names:
                raise ValueError(f"unknown {what} {v!r}; valid names: {', '.join(names)}")
            out.add(names.index(v))
        elif isinstance(v, int | np.integer) and not isinstance(v, bool):
            if not 0 <= v < len(names):
                raise ValueError(
                    f"{what} index {v} out of range 0–{len(names) - 1} ({', '.join(names)})"
                )
            out.add(int(v))
        else:
            raise ValueError(f"{what} filter takes names or indices, got {v!r}")
    return frozenset(out)


def _check_pitch_range(pitch_range: tuple[int, int] | None) -> tuple[int, int]:
    if pitch_range is None:
        return 0, 127
    try:
        lo, hi = pitch_range
    except (TypeError, ValueError):
        raise ValueError(f"pitch_range should be (lo, hi), got {pitch_range!r}") from None
    if not all(isinstance(p, int | np.integer) for p in (lo, hi)) or lo > hi:
        raise ValueError(f"pitch_range should be two MIDI pitches lo <= hi, got {pitch_range!r}")
    return int(lo), int(hi)
