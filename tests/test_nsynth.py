"""NSynth loader (vq.datasets.NSynth) on hand-written and generated data, its errors on broken
datasets, and the synthesized NSynth-format generator (vq.datasets.synthesize_nsynth)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from vq.datasets import FAMILIES, QUALITIES, SOURCES, NSynth, synth_nsynth, synthesize_nsynth
from vq.datasets.nsynth import FIELDS

sf = pytest.importorskip("soundfile")

SR, N = 16_000, 64_000

# the real schema, as in NSynth's examples.json (one note copied from it verbatim)
REAL_NOTES = {
    "bass_synthetic_033-022-050": {
        "note": 201034,
        "sample_rate": 16000,
        "pitch": 22.0,  # an int stored as a float: read leniently
        "instrument_source": 2,
        "instrument_family_str": "bass",
        "instrument_str": "bass_synthetic_033",
        "note_str": "bass_synthetic_033-022-050",
        "qualities_str": ["dark"],
        "instrument_source_str": "synthetic",
        "velocity": 50,
        "instrument_family": 0,
        "instrument": 417,
        "qualities": [0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
    },
    "keyboard_acoustic_004-060-100": {
        "note": 12345.0,
        "sample_rate": 16000,
        "pitch": 60,
        "instrument_source": 0,
        "instrument_family_str": "keyboard",
        "instrument_str": "keyboard_acoustic_004",
        "note_str": "keyboard_acoustic_004-060-100",
        "qualities_str": ["percussive", "reverb"],
        "instrument_source_str": "acoustic",
        "velocity": 100,
        "instrument_family": 4,
        "instrument": 327,
        "qualities": [0, 0, 0, 0, 0, 0, 0, 1, 1, 0],
    },
    "vocal_synthetic_003-064-127": {
        "note": 7,
        "sample_rate": 16000,
        "pitch": 64,
        "instrument_source": 2,
        "instrument_family_str": "vocal",
        "instrument_str": "vocal_synthetic_003",
        "note_str": "vocal_synthetic_003-064-127",
        "qualities_str": [],
        "instrument_source_str": "synthetic",
        "velocity": 127,
        "instrument_family": 10,
        "instrument": 912,
        "qualities": [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    },
}


def sine_pcm(pitch: float, amplitude: float = 0.5, n: int = N, sr: int = SR) -> np.ndarray:
    f = 440.0 * 2 ** ((pitch - 69) / 12)
    return np.round(amplitude * 32767 * np.sin(2 * np.pi * f * np.arange(n) / sr)).astype(np.int16)


def write_real_schema(directory: Path) -> Path:
    """examples.json written by hand (json.dumps) and one int16 sine wav per note."""
    (directory / "audio").mkdir(parents=True)
    (directory / "examples.json").write_text(json.dumps(REAL_NOTES))
    for key, meta in REAL_NOTES.items():
        sf.write(directory / "audio" / f"{key}.wav", sine_pcm(meta["pitch"]), SR, "PCM_16")
    return directory


def read_json(directory: Path) -> dict:
    return json.loads((directory / "examples.json").read_text())


# -- generated fixtures (module scope: synthesis is the slow part) ---------------------------
@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """train: 11 instruments (one per family) × pitch 60 × velocities 25 and 127;
    test: 11 instruments × 3 notes from the default pitch and velocity grids."""
    root = tmp_path_factory.mktemp("nsynth")
    synthesize_nsynth(
        root, n_instruments=11, split="train", pitches=[60], velocities=(25, 127),
        notes_per_instrument=None,
    )  # fmt: skip
    synthesize_nsynth(root, n_instruments=11, split="test", notes_per_instrument=3)
    return root


@pytest.fixture(scope="module")
def train(generated) -> NSynth:
    return NSynth(generated, split="train")


@pytest.fixture(scope="module")
def test_split(generated) -> NSynth:
    return NSynth(generated, split="test")


# -- loader: real schema ---------------------------------------------------------------------
def test_reads_hand_written_real_schema(tmp_path):
    ds = NSynth(write_real_schema(tmp_path))
    assert len(ds) == 3
    assert ds.note_strs == sorted(REAL_NOTES)
    for i, key in enumerate(sorted(REAL_NOTES)):
        waveform, meta = ds[i]
        assert waveform.dtype == torch.float32 and waveform.shape == (N,)
        expected = sine_pcm(REAL_NOTES[key]["pitch"]).astype(np.float32) / 32768
        np.testing.assert_array_equal(waveform.numpy(), expected)
        assert set(meta) == set(FIELDS)
        for field, value in REAL_NOTES[key].items():
            assert meta[field] == value
            if isinstance(value, float | int):
                assert type(meta[field]) is int, field  # 22.0 comes back as 22
    _, bass = ds[0]
    assert bass["pitch"] == 22 and bass["note"] == 201034 and bass["qualities_str"] == ["dark"]
    assert ds[1][1]["note"] == 12345
    np.testing.assert_array_equal(ds.labels("instrument_family"), [0, 4, 10])
    np.testing.assert_array_equal(ds.labels("pitch"), [22, 60, 64])
    assert ds.labels("pitch").dtype == np.int64
    assert ds.labels("qualities").shape == (3, 10)
    assert ds[-1][1]["note_str"] == "vocal_synthetic_003-064-127"
    with pytest.raises(IndexError):
        ds[3]
    with pytest.raises(ValueError, match="integer field"):
        ds.labels("note_str")


def test_items_are_copies(tmp_path):
    ds = NSynth(write_real_schema(tmp_path))
    _, meta = ds[0]
    meta["pitch"] = 99
    meta["qualities"][0] = 1
    assert ds[0][1]["pitch"] == 22 and ds.metadata[0]["qualities"][0] == 0


def test_split_directory(tmp_path):
    write_real_schema(tmp_path / "valid")
    assert len(NSynth(tmp_path, split="valid")) == 3
    write_real_schema(tmp_path / "nsynth-test")  # the official archives' names
    assert NSynth(tmp_path, split="test").directory == tmp_path / "nsynth-test"
    assert len(NSynth(tmp_path, split="nsynth-test")) == 3
    with pytest.raises(FileNotFoundError, match=r"split directories \['nsynth-test', 'valid'\]"):
        NSynth(tmp_path)


# -- loader: broken datasets -----------------------------------------------------------------
BASS = "bass_synthetic_033-022-050"


def set_field(field, value):
    def mutate(d: Path) -> None:
        notes = read_json(d)
        notes[BASS][field] = value
        (d / "examples.json").write_text(json.dumps(notes))

    return mutate


def drop_field(field):
    def mutate(d: Path) -> None:
        notes = read_json(d)
        del notes[BASS][field]
        (d / "examples.json").write_text(json.dumps(notes))

    return mutate


def write_wav(data, sr=SR):
    return lambda d: sf.write(d / "audio" / f"{BASS}.wav", data, sr, "PCM_16")


# name: (mutate the directory, NSynth kwargs, error, message pattern, raised by "init" or "item")
BROKEN = {
    "missing json": (
        lambda d: (d / "examples.json").unlink(),
        {},
        FileNotFoundError,
        r"examples\.json not found.*<root>/\[<split>/\]audio/<note_str>\.wav"
        r".*vq\.datasets\.synthesize_nsynth",
        "init",
    ),
    "bad json": (
        lambda d: (d / "examples.json").write_text('{"a": {'),
        {},
        ValueError,
        r"examples\.json: not valid JSON",
        "init",
    ),
    "not an object": (
        lambda d: (d / "examples.json").write_text("[1, 2]"),
        {},
        ValueError,
        r"examples\.json: expected a JSON object mapping note_str to metadata, got a list",
        "init",
    ),
    "missing field": (
        drop_field("velocity"),
        {},
        ValueError,
        rf"note '{BASS}': missing field\(s\) \['velocity'\]",
        "init",
    ),
    "non-integer float pitch": (
        set_field("pitch", 22.5),
        {},
        ValueError,
        rf"note '{BASS}': field 'pitch' should be an integer, got 22\.5",
        "init",
    ),
    "string pitch": (
        set_field("pitch", "22"),
        {},
        ValueError,
        r"field 'pitch' should be an integer, got '22'",
        "init",
    ),
    "family index and name disagree": (
        set_field("instrument_family", 3),
        {},
        ValueError,
        r"instrument_family=3 and instrument_family_str='bass' disagree",
        "init",
    ),
    "key is not note_str": (
        set_field("note_str", "bass_synthetic_033-022-051"),
        {},
        ValueError,
        r"note_str is 'bass_synthetic_033-022-051', expected the key",
        "init",
    ),
    "missing wav": (
        lambda d: (d / "audio" / f"{BASS}.wav").unlink(),
        {},
        FileNotFoundError,
        rf"{BASS}\.wav: audio file is missing",
        "item",
    ),
    "truncated wav": (
        write_wav(sine_pcm(22)[:32_000]),
        {},
        ValueError,
        rf"{BASS}\.wav: truncated: expected 64000 samples \(4 s at 16 kHz\), got 32000",
        "item",
    ),
    "cut-off wav file": (
        lambda d: (d / "audio" / f"{BASS}.wav").write_bytes(
            (d / "audio" / f"{BASS}.wav").read_bytes()[:50_044]  # header intact: 25,000 samples
        ),
        {},
        ValueError,
        rf"{BASS}\.wav: truncated: expected 64000 samples \(4 s at 16 kHz\), got 25000",
        "item",
    ),
    "44.1 kHz wav": (
        write_wav(sine_pcm(22, sr=44_100), sr=44_100),
        {},
        ValueError,
        rf"{BASS}\.wav: expected 16000 Hz audio, got 44100 Hz",
        "item",
    ),
    "stereo wav": (
        write_wav(np.stack([sine_pcm(22)] * 2, axis=1)),
        {},
        ValueError,
        rf"{BASS}\.wav: expected mono audio, got 2 channels",
        "item",
    ),
    "not a wav": (
        lambda d: (d / "audio" / f"{BASS}.wav").write_bytes(b"RIFF junk"),
        {},
        ValueError,
        rf"{BASS}\.wav: not a readable WAV file",
        "item",
    ),
    "unknown family filter": (
        lambda d: None,
        {"families": ["bass", "drums"]},
        ValueError,
        r"unknown instrument family 'drums'; valid names: bass, brass, flute, guitar, keyboard, "
        r"mallet, organ, reed, string, synth_lead, vocal",
        "init",
    ),
    "family index out of range": (
        lambda d: None,
        {"families": 11},
        ValueError,
        r"instrument family index 11 out of range 0–10",
        "init",
    ),
    "unknown source filter": (
        lambda d: None,
        {"sources": "analog"},
        ValueError,
        r"unknown instrument source 'analog'; valid names: acoustic, electronic, synthetic",
        "init",
    ),
    "bad pitch range": (
        lambda d: None,
        {"pitch_range": (60, 50)},
        ValueError,
        r"pitch_range should be two MIDI pitches lo <= hi, got \(60, 50\)",
        "init",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_dataset_raises_clear_error(tmp_path, case):
    mutate, kwargs, error, pattern, when = BROKEN[case]
    root = write_real_schema(tmp_path)
    mutate(root)
    if when == "init":
        with pytest.raises(error, match=pattern):
            NSynth(root, **kwargs)
        return
    ds = NSynth(root, **kwargs)  # metadata is fine: audio is checked per item
    assert len(ds) == 3 and ds.note_strs[0] == BASS
    ds[1]  # the other notes still load
    with pytest.raises(error, match=pattern):
        ds[0]


# -- loader: filters -------------------------------------------------------------------------
def test_family_and_source_filters(train):
    assert len(train) == 22
    brass = NSynth(train.root, split="train", families="brass")
    assert len(brass) == 2 and set(brass.labels("instrument_family")) == {1}
    mixed = NSynth(train.root, split="train", families=[0, "flute", np.int64(10)])
    assert set(mixed.labels("instrument_family")) == {0, 2, 10} and len(mixed) == 6
    sources = train.labels("instrument_source")
    for name, index in (("synthetic", 2), ("acoustic", 0)):
        for value in (name, index):
            ds = NSynth(train.root, split="train", sources=value)
            assert len(ds) == np.sum(sources == index) > 0
            assert set(ds.labels("instrument_source")) == {index}
    both = NSynth(train.root, split="train", families=["bass", "organ"], sources=["synthetic"])
    expected = [
        n for n, m in zip(train.note_strs, train.metadata, strict=True)
        if m["instrument_family"] in (0, 6) and m["instrument_source"] == 2
    ]  # fmt: skip
    assert both.note_strs == expected


def test_pitch_range_filter(tmp_path, test_split):
    ds = NSynth(write_real_schema(tmp_path), pitch_range=(50, 62))
    assert ds.note_strs == ["keyboard_acoustic_004-060-100"]
    assert NSynth(tmp_path, pitch_range=(22, 22)).note_strs == [BASS]
    assert len(NSynth(tmp_path, pitch_range=(65, 127))) == 0
    pitches = test_split.labels("pitch")
    lo, hi = int(np.percentile(pitches, 25)), int(np.percentile(pitches, 75))
    kept = NSynth(test_split.root, split="test", pitch_range=(lo, hi))
    assert len(kept) == np.sum((pitches >= lo) & (pitches <= hi)) > 0
    assert kept.labels("pitch").min() >= lo and kept.labels("pitch").max() <= hi


# -- generator: format and metadata ----------------------------------------------------------
def test_generated_wavs_are_nsynth_format(generated):
    for split in ("train", "test"):
        ds = NSynth(generated, split=split)
        for i in range(len(ds)):
            info = sf.info(ds.audio_path(i))
            assert (info.samplerate, info.channels, info.frames) == (SR, 1, N)
            assert info.subtype == "PCM_16" and info.format == "WAV"
            waveform, _ = ds[i]
            peak = waveform.abs().max().item()
            assert 0 < peak <= 1


def test_generated_metadata_complete_and_consistent(train, test_split):
    assert set(train.labels("instrument_family")) == set(range(11))  # one instrument a family
    assert set(train.labels("instrument_source")) == {0, 1, 2}
    for ds in (train, test_split):
        notes = [m["note"] for m in ds.metadata]
        assert len(set(notes)) == len(notes)
        instruments = {}
        for m in ds.metadata:
            assert set(m) == set(FIELDS)
            family, source = m["instrument_family_str"], m["instrument_source_str"]
            assert FAMILIES[m["instrument_family"]] == family
            assert SOURCES[m["instrument_source"]] == source
            assert re.fullmatch(rf"{family}_{source}_\d{{3}}", m["instrument_str"])
            assert m["note_str"] == f"{m['instrument_str']}-{m['pitch']:03d}-{m['velocity']:03d}"
            assert m["sample_rate"] == SR
            assert m["qualities_str"] == [
                q for q, on in zip(QUALITIES, m["qualities"], strict=True) if on
            ]
            assert (
                instruments.setdefault(m["instrument"], m["instrument_str"]) == m["instrument_str"]
            )
            lo, hi = synth_nsynth.FAMILY_PITCH_RANGES[family]
            assert 21 <= lo <= m["pitch"] <= hi <= 108
            if family == "mallet":
                assert "percussive" in m["qualities_str"]
        assert len(set(instruments.values())) == len(instruments)  # one id per instrument
    assert set(test_split.labels("velocity")) <= {25, 50, 75, 100, 127}
    assert len(set(test_split.labels("pitch"))) > 5  # pitches drawn across the ranges


def test_instruments_disjoint_between_splits(train, test_split):
    a = {m["instrument_str"] for m in train.metadata}
    b = {m["instrument_str"] for m in test_split.metadata}
    assert len(a) == len(b) == 11 and not a & b
    assert not set(train.labels("instrument")) & set(test_split.labels("instrument"))
    assert not set(train.labels("note")) & set(test_split.labels("note"))


def test_deterministic_for_a_seed(tmp_path, generated):
    kwargs = dict(n_instruments=11, pitches=[60], velocities=(25, 127), notes_per_instrument=None)
    same = synthesize_nsynth(tmp_path / "same", split="train", **kwargs)
    other = synthesize_nsynth(tmp_path / "other", split="train", seed=1, **kwargs)
    reference = generated / "train"
    names = sorted(p.name for p in (reference / "audio").iterdir())
    assert names == sorted(p.name for p in (same / "audio").iterdir())
    assert (same / "examples.json").read_bytes() == (reference / "examples.json").read_bytes()
    for name in names:
        assert (same / "audio" / name).read_bytes() == (reference / "audio" / name).read_bytes()
        assert (other / "audio" / name).read_bytes() != (reference / "audio" / name).read_bytes()


def test_existing_dataset_and_interrupted_run(tmp_path, monkeypatch):
    small = dict(n_instruments=2, pitches=[60], velocities=[100])
    synthesize_nsynth(tmp_path, **small)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        synthesize_nsynth(tmp_path, **small)
    render, calls = synth_nsynth._render_note, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return render(*args)

    monkeypatch.setattr(synth_nsynth, "_render_note", failing)
    with pytest.raises(KeyboardInterrupt):
        synthesize_nsynth(tmp_path, overwrite=True, **small)
    # no examples.json pointing at audio that was never written, and no temporary file left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audio"]
    monkeypatch.undo()
    assert len(NSynth(synthesize_nsynth(tmp_path, **small))) == 2


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"split": "validation"}, r"split must be None, 'train', 'valid' or 'test'"),
        ({"pitches": [20, 60]}, r"pitches must be .* MIDI numbers in 21–108, got \[20, 60\]"),
        ({"pitches": [100]}, r"none of the pitches \[100\] lies in the bass range 21–67"),
        ({"pitches": [60.5]}, r"pitches must be .* MIDI numbers in 21–108, got \[60\.5\]"),
        ({"velocities": [0, 64]}, r"velocities must be .* in 1–127"),
        ({"n_instruments": 0}, r"n_instruments must be in 1–3300, got 0"),
        ({"seed": -1}, r"seed must be a non-negative int, got -1"),
    ],
)
def test_generator_rejects_bad_arguments(tmp_path, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        synthesize_nsynth(tmp_path, **kwargs)
    assert not (tmp_path / "examples.json").exists()


# -- generator: the notes sound like notes ---------------------------------------------------
def test_release_over_the_last_second(train, test_split):
    for ds in (train, test_split):
        for i in range(len(ds)):
            x = ds[i][0].double()
            end_of_hold = x[int(2.5 * SR) : 3 * SR].pow(2).mean()
            last = x[int(3.5 * SR) :].pow(2).mean()
            assert last <= 0.01 * end_of_hold, ds.note_strs[i]  # at least 20 dB down
            assert x[-1] == 0


def test_velocity_sets_loudness_and_brightness(train):
    """Same instrument and pitch: 127 is louder (RMS) and brighter (RMS frequency of the power
    spectrum, sqrt(Σ f² P(f) / Σ P(f))) than 25."""
    freqs = np.fft.rfftfreq(3 * SR, 1 / SR)

    def rms_and_brightness(i):
        x = train[i][0].numpy().astype(np.float64)
        power = np.abs(np.fft.rfft(x[: 3 * SR])) ** 2
        return np.sqrt(np.mean(x**2)), np.sqrt(np.sum(power * freqs**2) / np.sum(power))

    by_instrument = {}
    for i, m in enumerate(train.metadata):
        by_instrument.setdefault(m["instrument_str"], {})[m["velocity"]] = rms_and_brightness(i)
    assert len(by_instrument) == 11
    for name, v in by_instrument.items():
        assert v[127][0] > 2 * v[25][0], name  # > 6 dB louder
        assert v[127][1] > v[25][1], name


def test_families_distinguishable_from_simple_features(tmp_path):
    """Not noise: a 1-nearest-neighbour family classifier on log-mel statistics and the energy
    envelope, evaluated leaving out each note's whole instrument, is far above chance (1/11).
    Pitches are limited to 60–67, inside every family's range, so the timbre must tell."""
    torchaudio = pytest.importorskip("torchaudio")
    root = synthesize_nsynth(
        tmp_path, n_instruments=44, notes_per_instrument=6, pitches=range(60, 68)
    )
    ds = NSynth(root)
    assert len(ds) == 264
    to_mel = torchaudio.transforms.MelSpectrogram(SR, n_fft=1024, hop_length=256, n_mels=40)
    batches = np.array_split(range(len(ds)), 8)
    mel = torch.cat([to_mel(torch.from_numpy(np.stack([ds[i][0] for i in b]))) for b in batches])
    log_mel = torch.log(mel + 1e-6)
    energy = mel.sum(1)
    energy_db = 10 * torch.log10(energy / energy.max(1, keepdim=True).values + 1e-9)
    onset = energy_db[:, :40]  # first 0.64 s, 16 ms frames
    envelope = torch.stack([c.mean(-1) for c in energy_db.chunk(16, dim=-1)], -1)

    def standardise(x):  # every group weighs the same
        x = (x - x.mean(0)) / (x.std(0) + 1e-6)
        return x / x.shape[1] ** 0.5

    family = torch.from_numpy(ds.labels("instrument_family"))
    instrument = torch.from_numpy(ds.labels("instrument"))

    def accuracy(*groups):
        features = torch.cat([standardise(g) for g in groups], 1).double()
        dist = torch.cdist(features, features)
        dist[instrument[:, None] == instrument[None, :]] = float("inf")
        return (family[dist.argmin(1)] == family).double().mean().item()

    # chance is 0.09; white noise under each note's own envelope scores 0.41 on all the
    # features and 0.17 on the spectral shape alone
    assert accuracy(log_mel.mean(-1), log_mel.std(-1), onset, envelope) >= 0.5
    assert accuracy(log_mel.mean(-1)) >= 0.4  # the average spectrum alone, no envelope
