"""IEEE half-precision (fp16) values read from their bits in numba, where ``np.float16``
arrays are not supported: the scalar-quantizer kernels' ``SQfp16`` codes
(:mod:`vq.kernels.sq.sq_scans`) and vectors a ``Refine`` keeps in fp16
(:mod:`vq.kernels.exact.exact_scans`), both passed as uint16 (or uint8 pairs) and decoded exactly
with integer operations that vectorise.

:func:`stored_value` reads element ``[i, j]`` of a row buffer as float32 whatever it holds:
float32 values as they are, uint16 words as halves; kernels written with it compile once per
storage type.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

#: 2**112: a half's exponent bits placed in a float32's, times this, give its value
_HALF_TO_FLOAT = np.float32(2.0**112)


@njit(inline="always")
def half_value(word):
    """float32 value of an IEEE half's bits (``word`` uint32 below 2**16), exactly: the sign
    moved to bit 31, exponent and mantissa to bits 13-27, then the float32 read from those
    bits times 2**112 (normal and subnormal halves alike); infinities and NaNs (exponent 31)
    get a float32 exponent of 255 through a mask (integer operations only: no branch or
    select, which kept the loop from vectorising)."""
    sign = (word & np.uint32(0x8000)) << np.uint32(16)
    bits = sign | ((word & np.uint32(0x7FFF)) << np.uint32(13))
    # all ones where the exponent is 31 (0x7C00 + 0x0400 carries into bit 15), else 0
    special = np.uint32(0) - (((word & np.uint32(0x7C00)) + np.uint32(0x0400)) >> np.uint32(15))
    return np.uint32(bits | (special & np.uint32(0x7F800000))).view(np.float32) * _HALF_TO_FLOAT


def stored_value(rows, i, j):
    """float32 value of ``rows[i, j]``: float32 rows as they are, uint16 rows (fp16 bits)
    decoded by :func:`half_value` (this body runs with ``NUMBA_DISABLE_JIT=1``; compiled
    kernels take the overload below)."""
    if rows.dtype == np.uint16:
        return half_value(np.uint32(rows[i, j]))
    return rows[i, j]


@overload(stored_value, inline="always")
def _stored_value(rows, i, j):
    if isinstance(rows, types.Array) and rows.dtype == types.uint16:
        return lambda rows, i, j: half_value(np.uint32(rows[i, j]))
    return lambda rows, i, j: rows[i, j]
