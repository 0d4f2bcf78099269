"""Input checks and numpy/torch conversion shared by every public entry point: of vectors
(:mod:`vq._checks.vectors`), of scalar options (:mod:`~vq._checks.options`), of codes and ids
(:mod:`~vq._checks.integer_inputs`), all importable from here.

Errors say what was expected and what came (``expected vectors of dim 128, got 96``). The checks
that read tensor values (NaN/Inf, code ranges) run only in eager mode, so that the same functions
can be traced, compiled and exported with static shapes.

The dtype policy, in one place:

- vectors: float32 is used as it is; float64 is converted to float32 (values beyond float32's
  range are refused, not turned into infinities); float16/bfloat16 are converted to float32, or
  kept by callers that accumulate them in float32 a chunk at a time (``keep_half``); integer,
  bool and complex input is a ``TypeError`` (convert explicitly: integer vectors are often codes
  or ids passed by mistake).
- the indexes also refuse vectors of norm beyond :data:`MAX_NORM` (1e18), whose squared
  distances would overflow float32 (``check_vectors(..., max_norm=MAX_NORM)``).
- codes and ids: any integer dtype; floating-point codes/ids are a ``TypeError``.
- numpy arrays and torch tensors on any device are accepted, contiguous or not (numpy input is
  shared, not copied, where the dtype allows); Python lists are a ``TypeError`` (wrap them with
  ``np.asarray``), as are sparse and meta tensors.
"""

from vq._checks.integer_inputs import as_codes, as_ids, code_dtype
from vq._checks.options import (
    SEED_MAX,
    check_flag,
    check_int,
    check_positive,
    check_real,
    check_seed,
    check_training_size,
    is_integer,
)
from vq._checks.vectors import (
    MAX_NORM,
    as_tensor,
    as_vectors,
    check_finite,
    check_norms,
    check_vectors,
    in_chunks,
    is_eager,
    like_input,
    norms_within,
)

__all__ = [
    "MAX_NORM",
    "SEED_MAX",
    "as_codes",
    "as_ids",
    "as_tensor",
    "as_vectors",
    "check_finite",
    "check_flag",
    "check_int",
    "check_norms",
    "check_positive",
    "check_real",
    "check_seed",
    "check_training_size",
    "check_vectors",
    "code_dtype",
    "in_chunks",
    "is_eager",
    "is_integer",
    "like_input",
    "norms_within",
]
