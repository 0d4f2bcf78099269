"""Checks of the scalar options of constructors and calls: integers, flags, seeds, real numbers
and training-set sizes. A wrong type is a TypeError, a wrong value a ValueError naming the
accepted range (:func:`check_positive`: one ValueError for both, for the options of a call).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def is_integer(value: Any) -> bool:
    """Whether ``value`` is an integer: a Python or numpy integer, not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_flag(value: Any, name: str) -> bool:
    """``value`` as a Python bool if it is one (or a numpy bool): for the on/off options of a
    constructor (``spill``, ``sketch``, ``by_residual``, ``fast_scan``), where a string such
    as ``"no"`` would otherwise switch the option on; anything else is a TypeError."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_int(value: Any, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as a Python int: integers (Python or numpy, not bool) at least ``minimum``
    and at most ``maximum`` (constructor arguments: a wrong type is a TypeError, a wrong value
    a ValueError naming the accepted range)."""
    if not is_integer(value):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")
    return int(value)


#: seeds are integers in [0, 2**63) (what torch and numpy generators take, and JSON keeps)
SEED_MAX = (1 << 63) - 1


def check_seed(value: Any, name: str = "seed") -> int:
    """A random seed: an integer in [0, 2**63) (None is refused: a saved index must rebuild
    and retrain the same way, so its seed is a number)."""
    if value is None:
        raise TypeError(f"{name} must be an integer in [0, 2**63), got None; pick a number")
    return check_int(value, name, 0, SEED_MAX)


def check_real(value: Any, name: str, minimum: float = 0.0) -> float:
    """``value`` as a Python float: a finite real number (int or float, numpy's too, not
    bool) at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if not (minimum <= v < float("inf")):
        raise ValueError(f"{name} must be a finite number >= {minimum:g}, got {value!r}")
    return v


def check_positive(value: Any, name: str, what: str = "a positive integer") -> int:
    """``value`` as a Python int if it is an integer >= 1 (Python or numpy, not bool): for the
    options of a call (``k``, ``nprobe``, ``k_factor``, a batch size), where any bad value, of
    whatever type, is one ValueError: ``"{name} must be {what}, got {value!r}"``."""
    if not is_integer(value) or value < 1:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(value)


def check_training_size(n: int, k: int, what: str) -> None:
    if not is_integer(k):
        raise TypeError(f"{what}: k must be an integer number of centroids, got {k!r}")
    if k <= 0:
        raise ValueError(f"{what}: k must be a positive number of centroids, got {k}")
    if n == 0:
        raise ValueError(f"{what}: got an empty training set (0 vectors)")
    if n < k:
        raise ValueError(
            f"{what}: needs at least k={k} training vectors, got {n}; "
            "give more vectors or ask for fewer centroids"
        )
