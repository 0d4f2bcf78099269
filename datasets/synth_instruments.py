"""Instruments of the NSynth-format generator (:mod:`vq.datasets.synth_nsynth`): each family's
timbre model, drawn per instrument.

:func:`draw_instrument` draws one instrument's parameters, a plain dict that
:func:`vq.datasets.synth_render.render_note` plays: the parameters every model reads (at their
defaults, see :func:`_shared_parameters`) overridden by the family's model, which the source
varies (acoustic: noise, jitter, inharmonicity, body resonances, some room reverb; electronic:
cleaner, FM or pickups; synthetic: plain saw/square/sine waves and filter sweeps).
:func:`instrument_qualities` reads NSynth's quality indicators off those parameters.

The draws come from the instrument's own generator in a fixed order, so a seed fixes the
instrument: reordering the draws below changes every generated dataset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vq.datasets.nsynth import QUALITIES

_VOWELS = {  # F1, F2, F3 (Hz)
    "a": (730, 1090, 2440),
    "e": (530, 1840, 2480),
    "i": (270, 2290, 3010),
    "o": (570, 840, 2410),
    "u": (300, 870, 2240),
}


def draw_instrument(family: str, source: str, rng: np.random.Generator) -> dict[str, Any]:
    """One instrument's parameters from its family's model and its source.

    Args:
        family: one of :data:`vq.datasets.FAMILIES`.
        source: one of :data:`vq.datasets.SOURCES` ("acoustic", "electronic", "synthetic").
        rng: the instrument's own generator (its draws fix the instrument).

    Returns:
        The parameters :func:`vq.datasets.synth_render.render_note` plays: the keys of
        :func:`_shared_parameters`, plus the model's own (``ratios``, ``tau``, ...).
    """
    bright = rng.uniform()
    p = _shared_parameters(rng, bright, source == "acoustic")
    # Each family keeps its signature (envelope class, spectral shape) across sources; the
    # source changes the means: plucked string or filtered saw, piano or FM or square, ...
    p |= _FAMILY_MODELS[family](rng, bright, source)
    if source == "acoustic" and rng.uniform() < 0.3:
        p["reverb"] = (rng.uniform(0.15, 0.35), rng.uniform(0.1, 0.3), int(rng.integers(2**31)))
    return p


def instrument_qualities(p: dict[str, Any]) -> tuple[int, ...]:
    """NSynth's quality indicators, read off the model's parameters: one 0/1 int per entry of
    :data:`vq.datasets.QUALITIES`, in that order."""
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


def _shared_parameters(rng: np.random.Generator, bright: float, acoustic: bool) -> dict[str, Any]:
    """The parameters every model reads, at their defaults (a harmonic model, no effects)."""
    u = rng.uniform
    return {
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


def _plucked_string(
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


# -- the family models: (rng, bright, source) → the parameters that differ from the shared ones
def _bass(rng: np.random.Generator, bright: float, source: str) -> dict[str, Any]:
    """Plucked string (decaying inharmonic partials) / filtered saw synth bass."""
    return _plucked_or_synth_string(rng, bright, source, low=True)


def _guitar(rng: np.random.Generator, bright: float, source: str) -> dict[str, Any]:
    """Plucked string, pluck-position comb, faster-decaying upper partials, distortion."""
    return _plucked_or_synth_string(rng, bright, source, low=False)


def _plucked_or_synth_string(
    rng: np.random.Generator, bright: float, source: str, *, low: bool
) -> dict[str, Any]:
    """A plucked string (acoustic, electronic: with a pickup, a guitar sometimes driven) or a
    square/saw synth through a closing filter (synthetic); ``low``: bass, else guitar."""
    u = rng.uniform
    acoustic = source == "acoustic"
    if source != "synthetic":
        p = _plucked_string(
            rng,
            bright,
            acoustic,
            tau=(1.2, 2.5) if low else (0.4, 1.0),
            rolloff=(2.0, 1.4) if low else (1.4, 0.8),
            pluck=(0.2, 0.35) if low else (0.05, 0.15),
        )
        if not low and not acoustic and u() < 0.5:
            p["drive"] = u(2.0, 6.0)
        return p
    p = {
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
    return p


def _brass(rng: np.random.Generator, bright: float, source: str) -> dict[str, Any]:
    """Bright harmonics whose brightness rises through the attack, pitch scoop, a formant near
    1.2 kHz."""
    u = rng.uniform
    acoustic, synthetic = source == "acoustic", source == "synthetic"
    return {
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


def _flute(rng: np.random.Generator, bright: float, source: str) -> dict[str, Any]:
    """Near-sinusoid with breath noise and vibrato."""
    u = rng.uniform
    return {
        "rolloff": (3.8 - 1.0 * bright) if source != "synthetic" else u(4.0, 6.0),
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


def _keyboard(rng: np.random.Generator, bright: float, source: str) -> dict[str, Any]:
    """Stretched piano partials with two-stage decay / FM electric piano / square synth."""
    u = rng.uniform
    if source == "acoustic":  # piano: stretched partials, two-stage decay
        p = _plucked_string(
            rng, bright, True, tau=(2.0, 4.0), rolloff=(1.6, 1.0), pluck=(1 / 9, 1 / 7)
        )
        p |= {
            "inharmonicity": u(2e-4, 8e-4),
            "two_stage": (  # every keyboard has a prompt decay, then a slow one
                u(0.5, 0.8),
                u(0.15, 0.4),
            ),  # fraction and time constant of the prompt decay
            "beta": u(0.6, 1.0),
        }
        return p
    if source == "electronic":  # FM electric piano
        r = [(1, 1), (1, 2), (1, 3), (2, 1)][rng.integers(4)]
        p = {
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
    else:  # square synth through a closing filter
        p = {
            "rolloff": 1.0,
            "even": u(0.0, 0.3),
            "attack": u(0.002, 0.005),
            "two_stage": (u(0.5, 0.8), u(0.1, 0.3)),
            "decay": u(1.5, 3.0),
            "sustain": 0.0,
            "sweep": ("down", u(400, 1500) * (0.5 + bright), u(0.1, 0.4)),
        }
    p["decay_s"] = p["decay"]
    return p


def _mallet(rng: np.random.Generator, bright: float, source: str) -> dict[str, Any]:
    """Inharmonic bar partials (1, 2.76, 5.40, 8.93) with fast decay and a strike."""
    u = rng.uniform
    ratios = {
        "acoustic": [1.0, 2.76, 5.40, 8.93, 13.34],
        "electronic": [1.0, 4.0, 10.0],  # tuned vibraphone bar
        "synthetic": [1.0, 2.76, 5.40],
    }[source]
    jitter = rng.uniform(-0.02, 0.02, len(ratios)) * (source != "synthetic")
    ratios = np.array(ratios) * (1 + jitter)
    ratios[0] = 1.0
    p = {
        "model": "mallet",
        "ratios": ratios,
        "amps": 0.6 ** np.arange(len(ratios)) * rng.uniform(0.5, 1.0, len(ratios)),
        "tau": u(0.2, 0.6) if source != "electronic" else u(0.5, 1.0),
        "alpha": u(0.7, 1.2),
        "strike": u(0.05, 0.2) if source == "acoustic" else u(0.0, 0.03),
        "attack": 0.001,
        "tremolo": (u(4.0, 7.0), u(0.3, 0.6)) if source == "electronic" and u() < 0.5 else None,
    }
    p["decay_s"] = p["tau"]
    return p


def _organ(rng: np.random.Generator, bright: float, source: str) -> dict[str, Any]:
    """Stationary drawbar (or rank) harmonics, fast attack, no decay, tremolo (Leslie) on some."""
    u = rng.uniform
    acoustic = source == "acoustic"
    bars = {1: 1.0} | {h: u(0, 1) * (u() < 0.6) for h in (2, 3, 4, 6, 8, 10, 12, 16)}
    bars[rng.choice([2, 4])] = u(0.5, 1.0)  # an octave is always drawn
    bars[3] = max(bars[3], u(0.3, 1.0))  # and the twelfth (odd: kept when synthetic)
    if source == "synthetic":
        bars = {h: lvl for h, lvl in bars.items() if h % 2 == 1 or h in (2, 4)}
    return {
        "drawbars": bars,
        "attack": u(0.005, 0.015) if not acoustic else u(0.02, 0.04),
        "release": u(0.03, 0.08),
        "beta": u(0.15, 0.4),  # the organ barely responds to velocity
        "detune": (u(0.001, 0.003),) if acoustic else (),  # a second rank, slightly off
        "noise": (u(0.005, 0.02), 300, 3000) if acoustic else None,
        "strike": u(0.01, 0.03) if source == "electronic" else 0.0,  # key click
        "tremolo": (u(5.5, 7.0), u(0.1, 0.25)) if source == "electronic" and u() < 0.5 else None,
    }


def _reed(rng: np.random.Generator, bright: float, source: str) -> dict[str, Any]:
    """Odd harmonics (clarinet-like bore) or a formant-shaped saxophone spectrum."""
    u = rng.uniform
    synthetic = source == "synthetic"
    return {
        "rolloff": 1.6 - 0.4 * bright if not synthetic else 1.2,
        "even": u(0.05, 0.25) if not synthetic else u(0.0, 0.1),
        "formants": [(u(1000, 2000), u(300, 700), u(0.5, 1.5))] if u() < 0.5 else [],
        "attack": u(0.03, 0.06),
        "vibrato": (u(4.5, 6.0), u(0.001, 0.003), u(0.3, 0.8)),
        "noise": (u(0.02, 0.05), 1000, 5000) if source == "acoustic" else None,
    }


def _string(rng: np.random.Generator, bright: float, source: str) -> dict[str, Any]:
    """Saw-like spectrum, body resonances, slow attack, delayed vibrato, bow noise."""
    u = rng.uniform
    synthetic = source == "synthetic"
    body = [(u(200, 600), u(80, 200), u(1, 3)), (u(800, 1500), u(150, 400), u(1, 3))]
    body += [(u(2000, 3500), u(300, 800), u(0.5, 2))]
    return {
        "rolloff": 1.2 - 0.3 * bright,
        "even": u(0.8, 1.0),
        "formants": body if not synthetic else [],
        "attack": u(0.2, 0.45),
        "vibrato": (u(5.0, 6.5), u(0.004, 0.008), u(0.2, 0.5)),
        "noise": (u(0.01, 0.03), 2000, 7000) if source == "acoustic" else None,
        "detune": (u(0.003, 0.007), -u(0.003, 0.007)) if synthetic else (),
    }


def _synth_lead(rng: np.random.Generator, bright: float, source: str) -> dict[str, Any]:
    """FM, or detuned saw/square voices with a filter sweep, gating, drive."""
    u = rng.uniform
    if source == "electronic":  # bright FM lead, a detuned voice
        r = [(1, 1), (1, 2), (2, 1), (1, 3)][rng.integers(4)]
        return {
            "model": "fm",
            "ratios": r,
            "index": u(2.5, 5.0) * (0.7 + 0.6 * bright),
            "index_decay": (u(0.6, 0.9), u(0.2, 0.6)),
            "detune": (u(0.003, 0.008),),
            "attack": u(0.005, 0.015),
            "sustain": 1.0,
            "drive": u(1.5, 4.0) if u() < 0.3 else 0.0,
        }
    return {  # detuned saws/squares through a closing filter
        "rolloff": 1.0,
        "even": rng.choice([0.0, 1.0]),
        "detune": tuple(rng.choice([-1, 1], 2) * rng.uniform(0.003, 0.009, 2)),
        "sweep": ("down", u(1000, 3000) * (0.5 + bright), u(0.1, 0.4)),
        "attack": u(0.005, 0.015),
        "gate": float(rng.choice([4.0, 6.0, 8.0])) if u() < 0.3 else None,
        "drive": u(1.5, 4.0) if u() < 0.3 else 0.0,
    }


def _vocal(rng: np.random.Generator, bright: float, source: str) -> dict[str, Any]:
    """Glottal harmonics shaped by three vowel formants, vibrato."""
    u = rng.uniform
    f1, f2, f3 = np.array(_VOWELS["aeiou"[rng.integers(5)]]) * u(0.9, 1.15)
    return {
        "rolloff": 1.3 - 0.4 * bright if source != "synthetic" else 0.8,
        "formants": [(f1, u(60, 120), 1.0), (f2, u(80, 150), 0.6), (f3, u(100, 200), 0.35)],
        "floor": 0.02,
        "attack": u(0.08, 0.15),
        "vibrato": (u(4.8, 6.0), u(0.006, 0.012), u(0.2, 0.5)),
        "noise": (u(0.02, 0.05), 2000, 6000) if source == "acoustic" else None,
    }


_FAMILY_MODELS = {
    "bass": _bass,
    "brass": _brass,
    "flute": _flute,
    "guitar": _guitar,
    "keyboard": _keyboard,
    "mallet": _mallet,
    "organ": _organ,
    "reed": _reed,
    "string": _string,
    "synth_lead": _synth_lead,
    "vocal": _vocal,
}
