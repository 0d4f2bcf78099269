"""How a quantizer's codebooks learn while it trains as a layer of a network (a VQ-VAE, a codec).

Three rules, chosen with the quantizer's ``learning`` argument:

- :class:`EMA` (``learning="ema"``): each codeword is the exponential moving average of the
  vectors assigned to it, from ``n_k ← γ n_k + (1-γ) count_k`` and
  ``m_k ← γ m_k + (1-γ) Σ_{x→k} x``: ``e_k = m_k / ñ_k`` with Laplace-smoothed counts
  ``ñ_k = (n_k + ε) / (N + Kε) · N`` (``smoothing="laplace"``, van den Oord et al. 2017,
  appendix; Razavi et al. 2019), or ``e_k ← (m_k + ε e_k) / (n_k + ε)`` (``smoothing=
  "codeword"``, vector-quantize-pytorch 1.34's rule: ε of the current codeword, so that an
  unused codeword stays where it is).
- :class:`Gradient` (``learning="grad"``): the codebook is an ``nn.Parameter`` trained by the
  optimizer through the codebook loss ``||sg(z) - e||²``.
- :class:`SimVQ` (``learning="simvq"``, :class:`vq.VectorQuantizer` and :class:`vq.ResidualVQ`):
  the stored codebook ``C`` is a frozen random buffer and the codewords are ``W C`` (row k:
  ``W c_k``) with ``W`` a learned linear map, the one codebook parameter, trained by the same
  codebook loss (Zhu et al. 2024): every codeword moves with every update of ``W``, so no code
  is left behind (no representation collapse).

Both share where codebooks start (k-means on the first training batch that holds vectors, or
random) and dead-code restart: a code whose moving-average usage falls below a threshold
(absolute, or a fraction of its codebook's mean usage) is replaced by a vector of the current
batch and its statistics reset. The state lives in buffers of :class:`CodebookLearner`
(``initted``, ``cluster_size``, ``embed_sum``), registered at construction and updated with
tensor operations only: the k-means initialisation (:mod:`vq.quantizers.kmeans_init`, an
opaque op) runs under ``torch.cond`` on the ``initted`` flag when compiled (a Python branch
eagerly), dead codes are replaced with ``torch.where`` from
a fixed-size random draw, counts use ``index_add_``. A compiled training step therefore has one
graph, before and after initialisation.

Under torch.distributed, updates all-reduce the batch statistics, the k-means initialisation
runs on every process's vectors (gathered) and is broadcast from rank 0, and dead-code
candidates are gathered so that every process writes the same codewords (see
:mod:`vq.parallel.sync`: the processes of :func:`vq.parallel.current_group`, so
``use_group(None)`` keeps a layer's training to its own process).

References:
    A. van den Oord, O. Vinyals, K. Kavukcuoglu, "Neural discrete representation learning",
    NeurIPS 2017. A. Razavi, A. van den Oord, O. Vinyals, "Generating diverse high-fidelity
    images with VQ-VAE-2", NeurIPS 2019. N. Zeghidour et al., "SoundStream", 2021 (k-means
    initialisation, dead-code restart). Y. Zhu, B. Li, Y. Xin, L. Xu, "Addressing
    representation collapse in vector quantized models with one linear layer", 2024 (SimVQ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vq._checks import is_eager
from vq.parallel import sync
from vq.quantizers.cluster_sums import cluster_sums
from vq.quantizers.functional import code_counts
from vq.quantizers.kmeans_init import kmeans_init, kmeans_init_op


@dataclass(frozen=True, kw_only=True)
class Learning:
    """What both learning rules share: how codebooks start, and when dead codes restart.

    Args:
        kmeans_init: initialise the codebooks by k-means (:func:`vq.kmeans`: random seeding,
            Lloyd iterations) on the first training batch; False starts from random
            codewords (uniform in ±1/K; unit vectors for cosine codebooks) and the layer can
            encode before it has seen data.
        kmeans_iters: Lloyd iterations of that k-means.
        dead_code_threshold: a code whose moving-average usage (expected uses per batch) falls
            below this is replaced by a vector of the current batch, and its usage reset to the
            threshold; 0 disables restarts.
        dead_code_ratio: the same restart with a relative threshold, in [0, 1): a code used
            less than this fraction of its codebook's mean usage restarts, its usage reset to
            ``reset_ratio`` (default: ``dead_code_ratio``) times that mean (vector-quantize-
            pytorch 1.34's ``dead_code_threshold_ratio``); 0 disables it. At most one of the
            two thresholds is set.
        reset_ratio: see ``dead_code_ratio``.

    Each restarted code takes a batch vector of its own. When a batch has fewer (real)
    vectors than there are dead codes, the least-used dead codes restart (ties in random
    order) and the rest wait for a later batch.
    """

    kmeans_init: bool = True
    kmeans_iters: int = 10
    dead_code_threshold: float = 0.0
    dead_code_ratio: float = 0.0
    reset_ratio: float | None = None

    def __post_init__(self) -> None:
        if self.kmeans_iters < 0:
            raise ValueError(f"kmeans_iters must be >= 0, got {self.kmeans_iters}")
        if not self.dead_code_threshold >= 0:
            raise ValueError(
                f"dead_code_threshold must be >= 0 (0 disables restarts), "
                f"got {self.dead_code_threshold}"
            )
        if not 0.0 <= self.dead_code_ratio < 1.0:
            raise ValueError(
                f"dead_code_ratio must lie in [0, 1) (a fraction of the mean code usage; 0 "
                f"disables restarts), got {self.dead_code_ratio}"
            )
        if self.dead_code_threshold > 0 and self.dead_code_ratio > 0:
            raise ValueError(
                f"dead_code_threshold={self.dead_code_threshold} and dead_code_ratio="
                f"{self.dead_code_ratio}: set one of them (an absolute usage or a fraction of "
                "the mean usage)"
            )
        if self.reset_ratio is not None and not (
            self.dead_code_ratio > 0 and self.reset_ratio >= 0
        ):
            raise ValueError(
                f"reset_ratio={self.reset_ratio}: it must be >= 0 and goes with "
                "dead_code_ratio > 0 (with dead_code_threshold the usage resets to the threshold)"
            )

    @property
    def restarts(self) -> bool:
        """Whether dead codes restart (either threshold set)."""
        return self.dead_code_threshold > 0 or self.dead_code_ratio > 0


@dataclass(frozen=True, kw_only=True)
class EMA(Learning):
    """Codewords as exponential moving averages of their assigned vectors.

    Args:
        decay: γ in [0, 1), the weight of the past (0.99 is usual; 0.8–0.9 learns faster).
        eps: ε of the smoothing (keeps unused codes finite).
        smoothing: ``"laplace"``: ``e = m / ñ`` with Laplace-smoothed counts, the statistics
            starting as one use of each codeword; ``"codeword"``: ``e ← (m + ε e) / (n + ε)``,
            the statistics starting at zero (at construction and after the k-means start), so
            that each codeword stays where it started until vectors are assigned to it.
        kmeans_init, kmeans_iters, dead_code_threshold, dead_code_ratio, reset_ratio: see
            :class:`Learning`.
    """

    decay: float = 0.99
    eps: float = 1e-5
    smoothing: str = "laplace"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must lie in [0, 1), got {self.decay}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")
        if self.smoothing not in ("laplace", "codeword"):
            raise ValueError(f"smoothing must be 'laplace' or 'codeword', got {self.smoothing!r}")


@dataclass(frozen=True, kw_only=True)
class Gradient(Learning):
    """Codewords as parameters, learned by the optimizer through the codebook loss.

    Args:
        codebook_weight: weight of ``||sg(z) - e||²`` in the layer's ``loss``.
        usage_decay: decay of the moving-average code usage that dead-code restart reads.
        kmeans_init, kmeans_iters, dead_code_threshold, dead_code_ratio, reset_ratio: see
            :class:`Learning`.
    """

    codebook_weight: float = 1.0
    usage_decay: float = 0.99

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.codebook_weight >= 0:
            raise ValueError(f"codebook_weight must be >= 0, got {self.codebook_weight}")
        if not 0.0 <= self.usage_decay < 1.0:
            raise ValueError(f"usage_decay must lie in [0, 1), got {self.usage_decay}")


@dataclass(frozen=True, kw_only=True)
class SimVQ(Gradient):
    """A frozen random codebook ``C`` [K, d] (Gaussian, variance 1/d) behind a learned linear
    map ``W`` [d, d]: the codewords are the rows of ``C Wᵀ`` (``W c_k``), and ``W`` — the
    quantizer's ``codebook_transform`` parameter, nn.Linear's initialisation, no bias — learns
    by gradient through the codebook loss ``||sg(z) - W c||²`` (Zhu et al. 2024; the anchor,
    vector-quantize-pytorch's ``SimVQ``, weighs it 1 and the commitment 0.25: set the layer's
    ``commitment_weight=0.25`` for the same loss). No k-means initialisation and no dead-code
    restart: the codebook is random by design and every codeword moves with ``W``.

    Args:
        codebook_weight: weight of ``||sg(z) - W c||²`` in the layer's ``loss``.
        usage_decay: decay of the moving-average code usage (a statistic here).
    """

    kmeans_init: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kmeans_init or self.restarts:
            raise ValueError(
                "SimVQ's codebook is a frozen random one behind a learned linear map: "
                "kmeans_init, dead_code_threshold and dead_code_ratio do not apply (leave them "
                "unset)"
            )


def as_learning(learning: str | Learning | None) -> Learning | None:
    """``"ema"`` → :class:`EMA()`, ``"grad"`` → :class:`Gradient()`, ``"simvq"`` →
    :class:`SimVQ()`; instances and None pass."""
    if learning is None or isinstance(learning, Learning):
        return learning
    named = {"ema": EMA, "grad": Gradient, "simvq": SimVQ}
    if learning in named:
        return named[learning]()
    raise ValueError(
        f"learning must be None (codebooks from fit), 'ema', 'grad', 'simvq', vq.EMA(...), "
        f"vq.Gradient(...) or vq.SimVQ(...), got {learning!r}"
    )


def check_fittable(quantizer) -> None:
    """Raise ValueError when ``quantizer`` learns by SimVQ (whose codebook must stay random)."""
    learner = quantizer.learner
    if learner is not None and isinstance(learner.learning, SimVQ):
        raise ValueError(
            f"a {type(quantizer).__name__} learning by SimVQ keeps its random codebook and "
            "learns in forward; fit does not apply (use learning='ema' or 'grad' to fit)"
        )


def simvq_init(groups: int, size: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SimVQ's starting state: frozen codebooks float32 [G, K, d] drawn from N(0, 1/d), and
    linear maps [G, d, d] initialised as ``nn.Linear(d, d, bias=False)`` (uniform in
    ±1/√d); drawn group by group, codebook then map, as vector-quantize-pytorch's
    ``SimVQ`` / ``ResidualSimVQ`` draw theirs (the same seed gives the same start)."""
    frozen, maps = torch.empty(groups, size, dim), torch.empty(groups, dim, dim)
    bound = 1.0 / math.sqrt(dim)
    for g in range(groups):
        frozen[g] = torch.randn(size, dim) * dim**-0.5
        maps[g].uniform_(-bound, bound)
    return frozen, maps


def transformed_codebooks(frozen: torch.Tensor, transform: torch.Tensor) -> torch.Tensor:
    """SimVQ's codewords: frozen codebooks [G, K, d] and maps [G, d, d] → float32 [G, K, d],
    row k of group g being ``W_g c_k`` (a batched matrix product; MatMul in ONNX)."""
    return torch.matmul(frozen.float(), transform.float().transpose(1, 2))


def random_codebooks(groups: int, size: int, dim: int, cosine: bool) -> torch.Tensor:
    """Starting codewords without data: uniform in ±1/K, or random unit vectors for cosine."""
    if cosine:
        return F.normalize(torch.randn(groups, size, dim), dim=-1)
    return torch.empty(groups, size, dim).uniform_(-1.0 / size, 1.0 / size)


class CodebookLearner(nn.Module):
    """Training state and update rule of G codebooks of K codewords of dimension d.

    The codewords themselves stay in the quantizer (``codebook``/``codebooks``, a buffer for
    EMA and a parameter for gradient learning); every method takes a ``[G', K, d]`` view of them
    (``G'`` = the groups being updated, selected by ``groups``) and writes it in place.

    Buffers:
        initted: bool [G], whether each codebook has been initialised.
        cluster_size: float32 [G, K], moving-average code usage (EMA: the ``n_k`` above).
        embed_sum: float32 [G, K, d], moving-average sum of assigned vectors (EMA only).
    """

    def __init__(self, learning: Learning, codebooks: torch.Tensor, cosine: bool = False):
        super().__init__()
        groups, size, _ = codebooks.shape
        self.learning, self.cosine, self.codebook_size = learning, cosine, size
        self.register_buffer("initted", torch.full((groups,), not learning.kmeans_init))
        start = torch.zeros if self.zero_start else torch.ones
        self.register_buffer("cluster_size", start(groups, size))
        if self.by_ema:
            sums = self._sums(codebooks.detach().float(), self.cluster_size)
            self.register_buffer("embed_sum", sums)

    @property
    def by_ema(self) -> bool:
        return isinstance(self.learning, EMA)

    @property
    def by_gradient(self) -> bool:
        return isinstance(self.learning, Gradient)

    @property
    def zero_start(self) -> bool:
        """Whether the statistics start at zero (EMA with ``smoothing="codeword"``)."""
        return self.by_ema and self.learning.smoothing == "codeword"

    def _smoothed(self, cluster_size: torch.Tensor) -> torch.Tensor:
        """Laplace-smoothed counts ``(n + ε) / (N + Kε) · N`` (EMA, ``"laplace"``)."""
        eps = self.learning.eps
        total = cluster_size.sum(-1, keepdim=True)
        return (cluster_size + eps) / (total + self.codebook_size * eps) * total

    def _sums(self, codewords: torch.Tensor, cluster_size: torch.Tensor) -> torch.Tensor:
        """The ``embed_sum`` [G', K, d] for which the EMA rule gives back ``codewords``
        [G', K, d] at usage ``cluster_size`` [G', K] (EMA only)."""
        counts = cluster_size if self.zero_start else self._smoothed(cluster_size)
        return codewords * counts[..., None]

    def _codewords(self, codebooks, embed_sum, cluster_size) -> torch.Tensor:
        """The EMA rule: statistics [G', K, d] / [G', K] (and the current codewords, which
        ``"codeword"`` smoothing pulls towards) → float32 codewords [G', K, d]."""
        if self.zero_start:
            eps = self.learning.eps
            new = (embed_sum + eps * codebooks.float()) / (cluster_size + eps)[..., None]
        else:
            new = embed_sum / self._smoothed(cluster_size)[..., None]
        return F.normalize(new, dim=-1) if self.cosine else new

    # -- initialisation ---------------------------------------------------------------------
    def initialize(
        self,
        codebooks: torch.Tensor,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        groups: slice,
        synced: bool,
    ) -> None:
        """k-means initialisation of the selected codebooks from ``x``, once: on the first
        batch that holds a vector of positive weight (on any process, when synced).

        Args:
            codebooks: Tensor[G', K, d], a view of the selected codebooks (written in place).
            x: float32 Tensor[G', n, d], the batch's vectors for each codebook (detached).
            weight: float Tensor[n], 0 for padding (excluded), or None.
            groups: which of the G codebooks ``codebooks`` holds.
            synced: initialise from every process's vectors and broadcast rank 0's result.
        """
        if not self.learning.kmeans_init:
            return
        weight = torch.ones(x.shape[1], device=x.device) if weight is None else weight.float()
        k, niter = self.codebook_size, self.learning.kmeans_iters
        state = [codebooks.detach(), self.cluster_size[groups]]
        if self.by_ema:
            state.append(self.embed_sum[groups])

        def current(x, weight, *state):
            return tuple(t.clone() for t in state)

        def new_state(centroids, counts):
            centroids = centroids.to(state[0].dtype)
            if self.zero_start:  # no evidence yet: the first update starts the averages
                return centroids, torch.zeros_like(counts), torch.zeros_like(state[2])
            if self.by_ema:
                return centroids, counts, self._sums(centroids.float(), counts)
            return centroids, counts

        def fresh(x, weight, *state):
            return new_state(*kmeans_init_op(x, weight, k, niter, self.cosine, synced))

        done = self.initted[groups].all()
        if is_eager():  # a Python branch: torch.cond would trace both functions on every call
            if bool(done) or not bool(self._has_vectors(weight, synced)):
                return  # initialised, or nothing to start from yet (every row masked or dropped)
            # the function itself: the custom op's eager call imports torch._dynamo, which a
            # new process would pay for on its first training step
            new = new_state(*kmeans_init(x, weight, k, niter, self.cosine, synced))
            started = torch.ones_like(done)
        else:  # one graph before and after initialisation
            started = self._has_vectors(weight, synced)
            new = torch.cond(done | ~started, current, fresh, (x, weight, *state))
        with torch.no_grad():
            for target, value in zip(state, new, strict=True):  # state[0] aliases codebooks
                target.copy_(value)
            self.initted[groups] |= started

    @staticmethod
    def _has_vectors(weight: torch.Tensor, synced: bool) -> torch.Tensor:
        """Whether any process's batch holds a vector of positive weight: a bool scalar (a
        first batch whose rows are all padding, or all dropped at this stage, defers the
        k-means start to the next batch)."""
        total = weight.sum()
        if synced:
            total = sync.all_reduce_sum(total)
        return total > 0

    def reset_(self, codebooks: torch.Tensor, counts: torch.Tensor) -> None:
        """Adopt codebooks trained elsewhere (``fit``): initialised, with usage ``counts``.

        Args:
            codebooks: Tensor[G, K, d]; counts: float Tensor[G, K] (code counts on the fit data).
        """
        with torch.no_grad():
            self.initted.fill_(True)
            self.cluster_size.copy_(counts)
            if self.by_ema:
                self.embed_sum.copy_(self._sums(codebooks.float(), counts))

    # -- one training step ------------------------------------------------------------------
    def update(
        self,
        codebooks: torch.Tensor,
        x: torch.Tensor,
        codes: torch.Tensor,
        weight: torch.Tensor | None,
        groups: slice,
        synced: bool,
    ) -> None:
        """Fold one batch into the statistics, update EMA codewords, restart dead codes.

        Args:
            codebooks: Tensor[G', K, d], a view of the selected codebooks (written in place).
            x: float32 Tensor[G', n, d], the vectors each codebook quantized (detached).
            codes: integer Tensor[G', n], their codes.
            weight: float Tensor[n] (0 = padding or a dropped stage), or None.
            groups: which of the G codebooks ``codebooks`` holds.
            synced: all-reduce the statistics and share restart candidates across processes.
        """
        size, dim = codebooks.shape[1], codebooks.shape[2]
        counts = code_counts(codes, size, weight)  # [G', K]
        if self.by_ema:
            n_groups = codes.shape[0]
            offsets = torch.arange(n_groups, device=codes.device)[:, None] * size
            w = None if weight is None else weight.float().repeat(n_groups)
            flat = (codes.long() + offsets).reshape(-1)
            sums = cluster_sums(x.reshape(-1, dim), flat, n_groups * size, w)
            sums = sums.reshape(n_groups, size, dim)
            if synced:  # one collective for both
                packed = sync.all_reduce_sum(torch.cat([counts[..., None], sums], dim=-1))
                counts, sums = packed[..., 0], packed[..., 1:]
        elif synced:
            counts = sync.all_reduce_sum(counts)
        rate = 1.0 - (self.learning.decay if self.by_ema else self.learning.usage_decay)
        with torch.no_grad():
            cluster_size = self.cluster_size[groups]
            cluster_size.lerp_(counts, rate)
            if self.by_ema:
                embed_sum = self.embed_sum[groups]
                embed_sum.lerp_(sums, rate)
                codebooks.copy_(self._codewords(codebooks, embed_sum, cluster_size))
            if self.learning.restarts:
                self._restart_dead_codes(codebooks, x, weight, groups, synced)

    def _dead_line(self, cluster_size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Usage [G', K] → (threshold below which a code is dead, the usage a restarted code
        gets), each [G', 1]."""
        learning = self.learning
        if learning.dead_code_threshold > 0:
            line = cluster_size.new_full((cluster_size.shape[0], 1), learning.dead_code_threshold)
            return line, line
        mean = cluster_size.mean(-1, keepdim=True)
        reset = learning.dead_code_ratio if learning.reset_ratio is None else learning.reset_ratio
        eps = learning.eps if self.by_ema else 1e-5
        return mean * learning.dead_code_ratio, mean.clamp_min(eps) * reset

    def _restart_dead_codes(self, codebooks, x, weight, groups: slice, synced: bool) -> None:
        """Replace dead codes by batch vectors, each its own: ``take = min(n, K)`` distinct
        random rows (real vectors before padding) go to the dead codes ranked by usage, least
        used first, ties in random order (the same order on every process); codes ranked past
        the batch's real vectors wait. Fixed shapes: every code gets a candidate every step,
        kept only where it restarts."""
        n_groups, size, dim = codebooks.shape
        n = x.shape[1]
        keys = torch.rand(n_groups, n, device=x.device)
        if weight is not None:
            keys = keys + weight  # real vectors (keys >= 1) come before padding (keys < 1)
        take = min(n, size)
        rows = keys.topk(take, dim=1).indices  # [G', take], distinct
        row_valid = torch.ones_like(rows, dtype=torch.float32) if weight is None else weight[rows]
        cluster_size = self.cluster_size[groups]
        line, reset = self._dead_line(cluster_size)
        dead = cluster_size < line
        tiebreak = torch.rand(n_groups, size, device=x.device)
        if synced:  # rank 0's draw (a gather: it compiles, where a broadcast does not)
            tiebreak = sync.all_gather(tiebreak)[0]
        order = tiebreak.argsort(dim=1)  # a random order, then a stable sort by usage
        usage = torch.where(dead, cluster_size, torch.inf).gather(1, order)
        order = order.gather(1, usage.argsort(dim=1, stable=True))
        ranks = torch.arange(size, device=x.device).expand(n_groups, size)
        rank = torch.empty_like(order).scatter_(1, order, ranks)  # each code's place
        slot = rank.clamp_max(take - 1)
        idx = rows.gather(1, slot)
        candidates = x.gather(1, idx[..., None].expand(n_groups, size, dim))
        valid = row_valid.gather(1, slot) * (rank < take)
        if synced:  # every process takes code k's candidate from process k mod world size
            world = sync.world_size()
            src = torch.arange(size, device=x.device) % world
            codes = torch.arange(size, device=x.device)
            candidates = sync.all_gather(candidates)[src, :, codes].transpose(0, 1)
            valid = sync.all_gather(valid)[src, :, codes].transpose(0, 1)
        if self.cosine:
            candidates = F.normalize(candidates, dim=-1)
        restart = dead & (valid > 0)
        codebooks.copy_(torch.where(restart[..., None], candidates.to(codebooks.dtype), codebooks))
        cluster_size.copy_(torch.where(restart, reset, cluster_size))
        if self.by_ema:  # so that the EMA rule gives back the new codeword
            embed_sum = self.embed_sum[groups]
            fresh = self._sums(candidates.float(), cluster_size)
            embed_sum.copy_(torch.where(restart[..., None], fresh, embed_sum))
