"""Template: PQ encoding and decoding for sub-vectors of DSUB dimensions, a compile-time
constant so that the inner loops unroll (see :func:`vq.kernels.pq_encoder` and
:func:`vq.kernels.pq_decoder`, which specialise it through :func:`vq.kernels.jit.cache.specialise`
and document it; never imported as it is)."""

import numpy as np

from vq.kernels.common.heaps import EMPTY_KEY, INDEX_MASK, float_key
from vq.kernels.common.threads import parallel_for
from vq.kernels.exact.lean_scans import all_finite
from vq.kernels.jit.cache import kernel
from vq.kernels.pq.coding import _EXPANSION_ERROR, _PQ_BLOCK

# -- specialised constants (vq.kernels.jit.cache.specialise writes these lines) --
DSUB = 1
# -- end of specialised constants --


def pq_encode(x, codebooks_t, norms, codes, sq_err):
    """Threads split the vectors, in blocks of 32 (see ``pq_encoder``)."""
    norm_max = norms.max(axis=1)
    parallel_for(
        encode_range, x.shape[0], x, codebooks_t, norms, norm_max, codes, sq_err, grain=_PQ_BLOCK
    )


@kernel(fastmath=True, nogil=True)
def encode_range(i0, i1, x, codebooks_t, norms, norm_max, codes, sq_err):
    """Vectors ``i0..i1`` on the calling thread (see ``pq_encoder``)."""
    n = x.shape[0]
    n_sub, _, ksub = codebooks_t.shape
    want_err = sq_err.shape[0] == n
    dist = np.empty(ksub, np.float32)
    bits = dist.view(np.int32)
    xs = np.empty(DSUB, np.float32)
    for i in range(i0, i1):
        err = np.float32(0.0)
        for m in range(n_sub):
            x_norm = np.float32(0.0)
            for j in range(DSUB):
                xs[j] = x[i, m * DSUB + j]
                x_norm += xs[j] * xs[j]
            for k in range(ksub):
                acc = norms[m, k]
                for j in range(DSUB):
                    acc += xs[j] * codebooks_t[m, j, k]
                dist[k] = acc
            best = EMPTY_KEY
            for k in range(ksub):
                best = min(best, float_key(bits[k], k))
            # the expanded form loses digits when the vectors are far from the origin
            # (|x|², |c|² >> |x - c|²): every candidate within its rounding error of the
            # best is compared again on the exact sum of squared differences
            code = best & INDEX_MASK
            limit = dist[code] + _EXPANSION_ERROR * (x_norm + norm_max[m])
            close = 0
            for k in range(ksub):  # vectorised count; almost always 1 (the best)
                close += np.int32(dist[k] <= limit)
            if close == 1:
                codes[i, m] = code
                err += max(dist[code] + x_norm, np.float32(0.0))
                continue
            exact = np.float32(np.inf)
            for k in range(ksub):
                if dist[k] <= limit:
                    e = np.float32(0.0)
                    for j in range(DSUB):
                        diff = xs[j] + np.float32(0.5) * codebooks_t[m, j, k]
                        e += diff * diff
                    if e < exact:
                        exact, code = e, k
            codes[i, m] = code
            err += exact
        if want_err:
            sq_err[i] = err


@kernel(nogil=True)
def encode_lean(x, codebooks_t, norms, norm_max, codes):
    """``encode_range`` over every row on the calling thread, without errors (the lean path of
    a few vectors); False (and nothing done) if a row holds a NaN or an infinity."""
    if not all_finite(x):
        return False
    encode_range(
        np.int64(0),
        np.int64(x.shape[0]),
        x,
        codebooks_t,
        norms,
        norm_max,
        codes,
        np.empty(0, dtype=np.float32),
    )
    return True


def pq_decode(codes, codebooks, out):
    """Threads split the rows (see ``pq_decoder``)."""
    parallel_for(decode_range, codes.shape[0], codes, codebooks, out)


@kernel(nogil=True)
def decode_range(i0, i1, codes, codebooks, out):
    """Rows ``i0..i1`` on the calling thread."""
    n_sub = codes.shape[1]
    for i in range(i0, i1):
        for m in range(n_sub):
            c = codes[i, m]
            for j in range(DSUB):
                out[i, m * DSUB + j] = codebooks[m, c, j]
