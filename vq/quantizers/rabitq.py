"""RaBitQ: one bit per dimension after a random rotation, with per-vector correction factors
that make the distance estimate unbiased and bound its error.

Reference: J. Gao, C. Long, "RaBitQ: Quantizing High-Dimensional Vectors with a Theoretical
Error Bound for Approximate Nearest Neighbor Search", SIGMOD 2024 (arXiv 2405.12497); the
multi-bit extension is J. Gao et al., "Practical and Asymptotically Optimal Quantization of
High-Dimensional Vectors in Euclidean Space for Approximate Nearest Neighbor Search", SIGMOD
2025 (not implemented here: ``nbits`` must be 1).

The scheme, in the rotated space (``x_r = x @ rotation``, ``rotation`` a random orthogonal
matrix, float32 [d, d]) around the centre ``c`` (the mean of the rotated training vectors):

- the code of a vector ``o`` is the sign pattern of its residual ``r = o_r - c``: bit j set
  where ``r_j > 0``, packed eight dimensions a byte, the lowest dimension in the lowest bit
  (faiss's layout): uint8 [n, ceil(d / 8)]. The quantized unit vector is
  ``ō = (2 b - 1) / sqrt(d)``;
- three float32 factors per vector, :data:`FACTORS` (faiss's ``SignBitFactorsWithError``):
  ``or_minus_c_l2sqr`` = ``||r||²`` (for inner products ``||r||² - ||o_r||²``),
  ``dp_multiplier`` = ``||r|| / <ō, r / ||r||>`` and ``f_error`` = ``2 ||r|| ε0
  sqrt((1 / <ō, r/||r||>² - 1) / (d - 1))`` (``ε0`` = 1.9; half that for inner products);
- the estimate, for a query q (rotated, ``q_c = q_r - c``): ``<r, q_c> ≈ dp_multiplier *
  <ō, q̂>`` with ``q̂ = q_c`` (``qb = 0``, a float query) or q_c scalar-quantized to ``qb``
  bits between its own minimum and maximum (faiss's default ``qb = 4``, which turns the dot
  product into popcounts), so that ``||o - q||² ≈ ||r||² + ||q_c||² - 2 dp_multiplier <ō, q̂>``
  (clamped at 0) and ``<o, q> ≈ (||q||² - that sum with the inner-product factor) / 2``.
  ``<ō, r> / <ō, r/||r||>`` is an unbiased estimator of ``<r, q>`` over the random rotation,
  and its error is close to Gaussian, ``f_error * ||q_c||`` (:func:`rabitq_error_bounds`)
  being about ε0 = 1.9 of its standard deviations (about 94% of the estimates fall within it:
  5.8% outside, measured on Gaussian vectors, d = 128): the bound that decides which
  candidates need exact distances.

This is faiss's ``IndexRaBitQ`` (whose ``RaBitQuantizer`` leaves the rotation to an
``IndexPreTransform`` in front, ``"RR,RaBitQ"``): the same bits, factors and estimates, so a
faiss index with the same centre (and rotation) gives the same results
(:class:`vq.index.RaBitQIndex` converts both ways). Every function below is one static-shape
torch graph (matrix products, comparisons, bit shifts), the device-agnostic path that also
exports; the CPU scan is :mod:`vq.kernels.rabitq.rabitq_scans`, tested against
:func:`rabitq_distances`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import nn

from vq._checks import as_vectors, check_int, check_seed, like_input

#: the per-vector factors, the columns of ``factors`` (faiss's ``SignBitFactorsWithError``)
FACTORS = ("or_minus_c_l2sqr", "dp_multiplier", "f_error")
#: the RaBitQ paper's confidence constant of the error bound (faiss's ``kConstEpsilon``)
EPSILON0 = 1.9
#: the most bits a query is quantized to (faiss's limit); 0 keeps it float
MAX_QB = 8
_FLT_EPS = float(torch.finfo(torch.float32).eps)
_METRICS = ("l2", "ip")


class RaBitQCodes(NamedTuple):
    """What :meth:`RaBitQ.encode` returns.

    Attributes:
        codes: uint8 [n, ceil(dim / 8)], the sign bits (bit j of byte j // 8 is dimension
            8 (j // 8) + j % 8).
        factors: float32 [n, 3], the :data:`FACTORS` of each vector.
    """

    codes: Any
    factors: Any


def code_size(dim: int) -> int:
    """Bytes of sign bits per vector: ``ceil(dim / 8)``."""
    return (dim + 7) // 8


def random_rotation(dim: int, seed: int) -> torch.Tensor:
    """A random orthogonal matrix float32 [dim, dim], Haar-distributed, the same for the same
    seed on every machine: the Q of a QR decomposition of a float64 Gaussian matrix drawn with
    a CPU ``torch.Generator``, its columns' signs fixed by R's diagonal. (faiss draws its own
    with its own generator; :class:`vq.index.RaBitQIndex` copies faiss's matrix instead.)"""
    g = torch.Generator().manual_seed(int(seed))
    a = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    signs = torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(torch.float64)
    return (q * signs).float()


_SHIFTS = torch.arange(8, dtype=torch.uint8)


def unpack_bits(codes: torch.Tensor, dim: int) -> torch.Tensor:
    """uint8 codes [n, ceil(dim / 8)] → the bits as float32 [n, dim] (0 or 1)."""
    shifts = _SHIFTS.to(codes.device)
    bits = (codes[:, :, None] >> shifts) & 1  # [n, bytes, 8], the lowest bit first
    return bits.reshape(codes.shape[0], -1)[:, :dim].float()


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """bool or 0/1 [n, dim] → uint8 [n, ceil(dim / 8)] (faiss's bit order)."""
    n, dim = bits.shape
    pad = code_size(dim) * 8 - dim
    b = torch.cat([bits.to(torch.uint8), bits.new_zeros(n, pad, dtype=torch.uint8)], dim=1)
    weights = torch.ones(8, dtype=torch.uint8, device=bits.device) << _SHIFTS.to(bits.device)
    return (b.reshape(n, -1, 8) * weights).sum(dim=2, dtype=torch.uint8)


def rabitq_encode(x_rotated: torch.Tensor, center: torch.Tensor, metric: str = "l2"):
    """The codes and factors of rotated vectors (one static-shape graph).

    Args:
        x_rotated: float32 [n, d], the vectors in the rotated space (``x @ rotation``).
        center: float32 [d], the centre in the rotated space (or [n, d]: each vector's own,
            an IVF list's rotated centroid).
        metric: "l2" or "ip" (the first factor differs: see the module docstring).

    Returns:
        codes uint8 [n, ceil(d / 8)] and factors float32 [n, 3] (:data:`FACTORS`), faiss's
        ``compute_vector_factors`` (including its guards: a zero residual gets factors 0, 0).
    """
    d = x_rotated.shape[1]
    r = x_rotated - center
    norm2 = (r * r).sum(dim=1)
    dp = r.abs().sum(dim=1)  # <sign(r), r>
    sqrt_norm = norm2.sqrt()
    inv_norm = torch.where(norm2 < _FLT_EPS, 1.0, 1.0 / sqrt_norm)
    normalized_dp = dp * inv_norm / math.sqrt(d)  # <ō, r / ||r||>
    inv_dp = torch.where(normalized_dp.abs() < _FLT_EPS, 1.0, 1.0 / normalized_dp)
    first = norm2 - (x_rotated * x_rotated).sum(dim=1) if metric == "ip" else norm2
    half_dp = 0.5 * dp
    ratio = norm2 * (0.25 * d) / torch.where(half_dp.abs() > _FLT_EPS, half_dp * half_dp, 1.0)
    spread = ((ratio - 1.0).clamp_min(0.0) / max(1, d - 1)).sqrt()
    error = torch.where(half_dp.abs() > _FLT_EPS, sqrt_norm * EPSILON0 * spread, 0.0)
    error = error * (2.0 if metric == "l2" else 1.0)
    factors = torch.stack([first, inv_dp * sqrt_norm, error], dim=1)
    return pack_bits(r > 0), factors


def errors_of_factors(factors2: torch.Tensor, dim: int, metric: str = "l2") -> torch.Tensor:
    """The third factor, ``f_error`` float32 [n], from the first two [n, 2] (what faiss's
    1-bit codes store): for "l2", ``||r|| = sqrt(or_minus_c_l2sqr)`` and ``<ō, r/||r||> =
    ||r|| / dp_multiplier`` give it as :func:`rabitq_encode` computes it (to float32
    rounding); for "ip" the first factor holds ``||r||² - ||o_r||²`` and ``||r||`` is lost:
    +inf (no bound)."""
    if metric == "ip":
        return torch.full_like(factors2[:, 0], float("inf"))
    norm = factors2[:, 0].clamp_min(0.0).sqrt()
    mult = factors2[:, 1]
    ndp = torch.where(mult > 0, norm / torch.where(mult > 0, mult, 1.0), 0.0)
    ratio = 1.0 / torch.where(ndp > _FLT_EPS, ndp * ndp, 1.0)
    spread = ((ratio - 1.0).clamp_min(0.0) / max(1, dim - 1)).sqrt()
    return torch.where(ndp > _FLT_EPS, 2.0 * norm * EPSILON0 * spread, 0.0)


def rabitq_decode(codes: torch.Tensor, factors: torch.Tensor, center: torch.Tensor):
    """float32 [n, d] in the rotated space: ``c + dp_multiplier * ō`` (faiss's ``decode``;
    ``center`` float32 [d], or [n, d]: each row's own, an IVF list's centroid).
    Built for inner products: ``<x̂ - c, r> = ||r||²`` exactly, and ``<x̂ - c, q>`` is the
    estimate of ``<r, q>``; its L2 error is not what RaBitQ minimises."""
    d = center.shape[-1]
    signs = unpack_bits(codes, d) * 2.0 - 1.0
    return center + signs * (factors[:, 1:2] / math.sqrt(d))


def quantized_levels(q_centred: torch.Tensor, qb: int):
    """faiss's scalar quantization of queries to ``qb`` (1..8) bits (``compute_query_factors``,
    not centred), one static-shape graph: each row of ``q_centred`` (float32 [..., d]) between
    its own minimum and maximum, level ``floor((v - vmin) / delta + 0.5)`` clamped to [0,
    2**qb - 1], ``delta = (vmax - vmin) / (2**qb - 1)`` (``1 / delta`` multiplied, 0 where
    delta is 0). Returns ``(levels, vmin, delta)``: float32 [..., d] (whole numbers), [..., 1],
    [..., 1]. The CPU kernels compute the same levels in the same float32 operations
    (:func:`vq.kernels.rabitq.rabitq_scans.quantize_planes`)."""
    top = float((1 << qb) - 1)
    vmin = q_centred.min(dim=-1, keepdim=True).values
    vmax = q_centred.max(dim=-1, keepdim=True).values
    delta = (vmax - vmin) / top
    inv = torch.where(delta > 0, 1.0 / torch.where(delta > 0, delta, 1.0), 0.0)
    levels = torch.floor((q_centred - vmin) * inv + 0.5).clamp(0.0, top)
    return levels, vmin, delta


def quantized_queries(q_centred: torch.Tensor, qb: int) -> torch.Tensor:
    """The query values the estimate uses: ``q_centred`` (float32 [..., d]) itself for
    ``qb = 0``, else its :func:`quantized_levels` dequantized, ``vmin + delta * level``."""
    if qb == 0:
        return q_centred
    levels, vmin, delta = quantized_levels(q_centred, qb)
    return vmin + delta * levels


def prepare_queries(queries: torch.Tensor, rotation: torch.Tensor, center: torch.Tensor, qb: int):
    """What an estimate needs of each query: ``q_hat`` float32 [nq, d] (the rotated, centred
    query ``q_c = q @ rotation - center``, quantized to ``qb`` bits: :func:`quantized_queries`)
    and ``constants`` float32 [nq, 2], ``||q_c||²`` and ``||q @ rotation||²``. The one query
    preparation of the torch search and of the CPU kernels
    (:mod:`vq.kernels.rabitq.rabitq_scans`)."""
    q_rot = queries @ rotation
    q_c = q_rot - center
    constants = torch.stack([(q_c * q_c).sum(dim=1), (q_rot * q_rot).sum(dim=1)], dim=1)
    return quantized_queries(q_c, qb), constants


def estimates(
    dots: torch.Tensor, factors: torch.Tensor, constants: torch.Tensor, metric: str
) -> torch.Tensor:
    """The estimates [nq, n] from ``dots`` = ``<ō, q_hat>`` float32 [nq, n], the codes'
    factors [n, 3] and the queries' ``constants`` [nq, 2] (:func:`prepare_queries`): squared
    L2 distances clamped at 0 ("l2") or inner products ("ip")."""
    pre = factors[:, 0] + constants[:, 0:1] - 2.0 * factors[:, 1] * dots
    if metric == "ip":
        return -0.5 * (pre - constants[:, 1:2])
    return pre.clamp_min(0.0)


def byte_tables(q_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-byte look-up tables of prepared queries: ``tables`` float32 [ceil(d/8), nq, 256],
    ``tables[b, i, v] = Σ_{bits j of v} 2 q_hat[i, 8 b + j] / sqrt(d)``, and ``offsets``
    float32 [nq, 1], ``Σ_j q_hat[i, j] / sqrt(d)``: ``<ō, q_hat> = Σ_b tables[b, i, code_b] -
    offsets[i]`` (what the CPU kernel builds, :mod:`vq.kernels.rabitq.rabitq_scans`)."""
    nq, d = q_hat.shape
    nb = code_size(d)
    scale = 2.0 / math.sqrt(d)
    padded = torch.cat([q_hat, q_hat.new_zeros(nq, nb * 8 - d)], dim=1).reshape(nq, nb, 8)
    values = torch.arange(256, device=q_hat.device)
    bits = ((values[None, :] >> torch.arange(8, device=q_hat.device)[:, None]) & 1).float()
    tables = (padded * scale) @ bits  # [nq, nb, 256]
    return tables.transpose(0, 1), q_hat.sum(dim=1, keepdim=True) * (0.5 * scale)


def sign_dots(q_hat: torch.Tensor, codes_t: torch.Tensor) -> torch.Tensor:
    """float32 [nq, n]: ``<ō, q_hat>`` for prepared queries [nq, d] and the codes transposed,
    integer [ceil(d/8), n]: :func:`byte_tables` summed over the code bytes with gathers, in
    the order of the bytes (memory O(nq n), no unpacked codes)."""
    tables, offsets = byte_tables(q_hat)
    tables = tables.transpose(1, 2)  # [nb, 256, nq]: rows of nq contiguous values per byte value
    sums = tables[0].index_select(0, codes_t[0].long())  # [n, nq]
    for b in range(1, codes_t.shape[0]):
        sums = sums + tables[b].index_select(0, codes_t[b].long())
    return sums.T - offsets


def rabitq_distances(
    queries: torch.Tensor,
    codes: torch.Tensor,
    factors: torch.Tensor,
    rotation: torch.Tensor,
    center: torch.Tensor,
    metric: str = "l2",
    qb: int = 0,
) -> torch.Tensor:
    """The RaBitQ estimates of squared L2 distances (or inner products) between queries and
    coded vectors, as one static-shape graph.

    Args:
        queries: float32 [nq, d], as given (not rotated).
        codes: uint8 [n, ceil(d / 8)]; factors: float32 [n, 3] (:func:`rabitq_encode`'s).
        rotation: float32 [d, d]; center: float32 [d] (rotated space).
        metric: "l2" (estimated squared distances, clamped at 0) or "ip" (estimated inner
            products).
        qb: bits of the query's scalar quantization (0: float query; see
            :func:`quantized_queries`).

    Returns:
        float32 [nq, n]. Cost: a [nq, d] x [d, d] rotation, tables of nq x ceil(d/8) x 256
        entries, and ceil(d/8) gathers of [n, nq].
    """
    q_hat, constants = prepare_queries(queries, rotation, center, qb)
    return estimates(sign_dots(q_hat, codes.T), factors, constants, metric)


def rabitq_error_bounds(
    queries: torch.Tensor, factors: torch.Tensor, rotation: torch.Tensor, center: torch.Tensor
) -> torch.Tensor:
    """float32 [nq, n]: ``f_error * ||q_r - c||``, the bound on the error of
    :func:`rabitq_distances`' float-query (``qb = 0``) estimate, squared L2 or inner product
    alike: about ε0 = 1.9 standard deviations of that error (about 94% of the estimates fall
    within it; a quantized query adds its own error)."""
    q_c = queries @ rotation - center
    return factors[:, 2] * (q_c * q_c).sum(dim=1, keepdim=True).sqrt()


def check_qb(qb: Any) -> int:
    """``qb`` as an int in [0, 8] (the query's bits; 0 keeps it float), or a clear error."""
    return check_int(qb, "qb", 0, MAX_QB)


class RaBitQ(nn.Module):
    """RaBitQ quantizer (faiss ``RaBitQuantizer`` behind a random rotation, as
    ``IndexRaBitQ`` in ``"RR,RaBitQ"``): 1-bit codes plus three float32 factors per vector.

    Args:
        dim: vector dimension d.
        nbits: bits per dimension; only 1 (extended RaBitQ, ``nbits > 1``, is not
            implemented: a ValueError says so).
        seed: the random rotation's seed (see :func:`random_rotation`).
        metric: "l2" or "ip": which distance the factors serve.
        rotate: False keeps the identity (faiss's bare ``IndexRaBitQ``, for data already
            rotated or a faiss index converted as it is).

    Buffers:
        rotation: float32 [d, d], orthogonal (``x_r = x @ rotation``; faiss's
        ``LinearTransform`` matrix is its transpose); center: float32 [d], the mean of the
        rotated training vectors (faiss's ``IndexRaBitQ.center``); trained: bool scalar.

    ``encode`` gives a :class:`RaBitQCodes` (codes uint8 [n, ceil(d/8)], factors float32
    [n, 3]); ``decode`` float32 [n, d]; ``distances`` the estimates [nq, n]; ``error_bounds``
    their bounds. Cost: encode O(n d²) (the rotation), a distance estimate O(d) per pair.
    """

    def __init__(
        self,
        dim: int,
        nbits: int = 1,
        seed: int = 1234,
        metric: str = "l2",
        *,
        rotate: bool = True,
    ):
        super().__init__()
        self.dim = check_int(dim, "dim", 1)
        nbits = check_int(nbits, "nbits", 1)
        if nbits != 1:
            raise ValueError(
                f"RaBitQ: nbits={nbits} (extended RaBitQ) is not implemented; use nbits=1, or "
                "faiss.IndexRaBitQ(d, metric, nb_bits) for multi-bit codes"
            )
        if metric not in _METRICS:
            raise ValueError(f"metric must be 'l2' or 'ip', got {metric!r}")
        if not isinstance(rotate, bool):
            raise TypeError(f"rotate must be True or False, got {rotate!r}")
        self.nbits, self.seed, self.metric, self.rotate = nbits, check_seed(seed), metric, rotate
        self.register_buffer("rotation", torch.eye(self.dim))
        self.register_buffer("center", torch.zeros(self.dim))
        self.register_buffer("trained", torch.zeros((), dtype=torch.bool))

    @property
    def code_size(self) -> int:
        """Bytes of sign bits per vector, ``ceil(dim / 8)`` (the factors are 12 more)."""
        return code_size(self.dim)

    @property
    def is_trained(self) -> bool:
        return bool(self.trained)

    def config(self) -> dict:
        """The constructor arguments (JSON-serialisable), as indexes save them."""
        return {"nbits": self.nbits, "seed": self.seed, "rotate": self.rotate}

    def set_state(self, rotation: torch.Tensor | None, center: torch.Tensor) -> RaBitQ:
        """Take a trained state as it is (faiss's, say): ``rotation`` float [d, d] orthogonal
        (None: the identity) and ``center`` float [d] in the rotated space. Returns self."""
        d = self.dim
        rot = torch.eye(d) if rotation is None else torch.as_tensor(rotation).float()
        c = torch.as_tensor(center).float().reshape(-1)
        if rot.shape != (d, d) or c.shape != (d,):
            raise ValueError(
                f"expected a rotation [{d}, {d}] and a center [{d}], got "
                f"{tuple(rot.shape)} and {tuple(c.shape)}"
            )
        gram = rot.double().T @ rot.double()
        if not torch.allclose(gram, torch.eye(d, dtype=torch.float64), atol=1e-4):
            raise ValueError("the rotation is not orthogonal (R^T R != I): RaBitQ needs one")
        self.rotation.copy_(rot.to(self.rotation.device))
        self.center.copy_(c.to(self.center.device))
        self.trained.fill_(True)
        return self

    # -- training and coding ------------------------------------------------------------------
    @torch.no_grad()
    def fit(self, x: Any) -> RaBitQ:
        """Draw the rotation (``seed``; identity if ``rotate`` is False) and set the centre to
        the mean of the rotated ``x`` (float [n, dim], n >= 1). Returns self."""
        t = as_vectors(x, self.dim, "x").float().to(self.center.device)
        if t.shape[0] < 1:
            raise ValueError("RaBitQ.fit needs at least one training vector, got 0")
        if self.rotate:
            self.rotation.copy_(random_rotation(self.dim, self.seed).to(self.rotation.device))
        else:
            self.rotation.copy_(torch.eye(self.dim, device=self.rotation.device))
        self.center.copy_((t @ self.rotation).mean(dim=0))
        self.trained.fill_(True)
        return self

    def _require_trained(self, what: str) -> None:
        if not self.is_trained:
            raise RuntimeError(f"RaBitQ.{what}: the quantizer is not trained; call fit(x)")

    def encode_rows(self, x: torch.Tensor) -> RaBitQCodes:
        """:meth:`encode` of checked float32 rows [n, dim] on the module's device (what an
        index calls): tensors."""
        return RaBitQCodes(*rabitq_encode(x @ self.rotation, self.center, self.metric))

    @torch.no_grad()
    def encode(self, x: Any) -> RaBitQCodes:
        """float [n, dim] → :class:`RaBitQCodes` (codes uint8 [n, ceil(dim/8)], factors
        float32 [n, 3]); numpy in, numpy out."""
        self._require_trained("encode")
        t = as_vectors(x, self.dim, "x").float().to(self.center.device)
        codes, factors = self.encode_rows(t)
        return RaBitQCodes(like_input(codes, x), like_input(factors, x))

    def _checked_codes(self, codes: Any, factors: Any) -> tuple[torch.Tensor, torch.Tensor]:
        c = torch.as_tensor(codes).to(self.center.device)
        f = torch.as_tensor(factors).to(self.center.device)
        if c.dtype != torch.uint8 or c.dim() != 2 or c.shape[1] != self.code_size:
            raise ValueError(
                f"codes must be uint8 [n, {self.code_size}], got {c.dtype} {tuple(c.shape)}"
            )
        if f.dim() != 2 or f.shape != (c.shape[0], len(FACTORS)) or not f.is_floating_point():
            raise ValueError(
                f"factors must be float32 [{c.shape[0]}, {len(FACTORS)}] (one row per code), "
                f"got {f.dtype} {tuple(f.shape)}"
            )
        return c, f.float()

    @torch.no_grad()
    def decode(self, codes: Any, factors: Any) -> Any:
        """Codes and factors → float32 [n, dim] (see :func:`rabitq_decode`, rotated back)."""
        self._require_trained("decode")
        c, f = self._checked_codes(codes, factors)
        return like_input(rabitq_decode(c, f, self.center) @ self.rotation.T, codes)

    @torch.no_grad()
    def distances(self, queries: Any, codes: Any, factors: Any, qb: int = 0) -> Any:
        """Estimated squared L2 distances (metric "l2") or inner products ("ip"), float32
        [nq, n] (see :func:`rabitq_distances`; ``qb`` 0 keeps the queries float)."""
        self._require_trained("distances")
        q = as_vectors(queries, self.dim, "queries").float().to(self.center.device)
        c, f = self._checked_codes(codes, factors)
        out = rabitq_distances(q, c, f, self.rotation, self.center, self.metric, check_qb(qb))
        return like_input(out, queries)

    @torch.no_grad()
    def error_bounds(self, queries: Any, factors: Any) -> Any:
        """float32 [nq, n]: the bound on each float-query estimate's error (see
        :func:`rabitq_error_bounds`)."""
        self._require_trained("error_bounds")
        q = as_vectors(queries, self.dim, "queries").float().to(self.center.device)
        f = torch.as_tensor(factors).float().to(self.center.device)
        if f.dim() != 2 or f.shape[1] != len(FACTORS):
            raise ValueError(f"factors must be float32 [n, 3], got {tuple(f.shape)}")
        return like_input(rabitq_error_bounds(q, f, self.rotation, self.center), queries)
