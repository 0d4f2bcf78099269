"""Residual (multi-stage) vector quantization, with greedy or beam-search encoding.

Stage m quantizes what stages 0..m-1 left over; x̂ is the sum of one codeword per stage.
Beam search keeps the ``beam_size`` best partial encodings at each stage instead of the single
greedy one (faiss ResidualQuantizer's ``max_beam_size``).

References:
    B.-H. Juang, A. H. Gray, "Multiple stage vector quantization for speech coding", ICASSP 1982.
    Y. Chen, T. Guan, C. Wang, "Approximate nearest neighbor search by residual vector
    quantization", Sensors 2010.
"""

from __future__ import annotations

import torch

from vq import _cpu, kernels
from vq._checks import is_eager
from vq.clustering import _generator, kmeans
from vq.distances import nearest
from vq.distributed.shards import Shards
from vq.quantizers.base import Metric, Quantizer


class ResidualVQ(Quantizer):
    """``num_quantizers`` stages of ``codebook_size`` codewords each, trained on residuals.

    Args:
        dim: vector dimension d.
        num_quantizers: number of stages Q.
        codebook_size: codewords per stage K.
        beam_size: 1 for greedy encoding; B > 1 keeps the B best partial encodings per stage,
            both when training (as faiss does) and when encoding.
        refine_iters: after the stage-by-stage training, rounds of re-encoding the training set
            and re-fitting every stage's codewords as the mean of what the other stages leave
            (block coordinate descent on the reconstruction error; never increases it).
        niter, init, seed, max_points_per_centroid: k-means settings of every stage.

    Buffers:
        codebooks: float32 [Q, K, d].

    Codes are ``[..., Q]``. ``distance_tables`` is ``[nq, Q, K]``: for "ip" the tables sum to
    ⟨q, x̂⟩; for "l2" they sum to ``||q||² - 2⟨q, x̂⟩ + Σ_m ||c_m||²``, which lacks the cross terms
    ``2 Σ_{i<j} ⟨c_i, c_j⟩`` of ``||x̂||²`` — add :meth:`norms` of the codes (``||x̂||²``) and
    subtract ``Σ_m ||c_m||²`` (:meth:`codeword_norm_sums`) for the exact squared distance, as
    faiss stores norms beside residual codes.
    """

    def __init__(
        self,
        dim: int,
        num_quantizers: int,
        codebook_size: int,
        beam_size: int = 1,
        *,
        refine_iters: int = 2,
        niter: int = 25,
        init: str = "k-means++",
        seed: int = 1234,
        max_points_per_centroid: int = 256,
    ):
        if num_quantizers < 1:
            raise ValueError(f"num_quantizers must be >= 1, got {num_quantizers}")
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        super().__init__(dim, codebook_size, (num_quantizers,))
        if refine_iters < 0:
            raise ValueError(f"refine_iters must be >= 0, got {refine_iters}")
        self.num_quantizers, self.beam_size, self.refine_iters = (
            num_quantizers,
            beam_size,
            refine_iters,
        )
        self.niter, self.init, self.seed = niter, init, seed
        self.max_points_per_centroid = max_points_per_centroid
        self.register_buffer("codebooks", torch.zeros(num_quantizers, codebook_size, dim))
        self.register_buffer(
            "_offsets", torch.arange(num_quantizers) * codebook_size, persistent=False
        )

    # -- training ---------------------------------------------------------------------------
    def _fit(self, x: torch.Tensor) -> None:
        # every stage's k-means would subsample to this many vectors anyway
        gen = _generator(self.seed)
        # under torch.distributed x is this process's shard: keep its part of the global sample
        x = Shards.of(x).subsample(self.codebook_size * self.max_points_per_centroid, gen).local
        n = x.shape[0]
        codes = torch.zeros(n, 1, 0, dtype=torch.long, device=x.device)
        residuals = x[:, None, :].clone()  # [n, beam, d]
        for m in range(self.num_quantizers):
            result = kmeans(
                residuals.reshape(-1, self.dim),
                self.codebook_size,
                niter=self.niter,
                init=self.init,
                seed=self.seed + m,
                max_points_per_centroid=self.max_points_per_centroid,
            )
            self.codebooks[m].copy_(result.centroids)
            rows = max(1, (1 << 20) // (residuals.shape[1] * self.codebook_size))
            steps = [
                self._beam_step(codes[s : s + rows], residuals[s : s + rows], m, self.beam_size)
                for s in range(0, n, rows)
            ]
            codes = torch.cat([c for c, _, _ in steps])
            residuals = torch.cat([r for _, r, _ in steps])
        for _ in range(self.refine_iters):
            self._refine(x, self._encode(x))

    def _refine(self, x: torch.Tensor, codes: torch.Tensor) -> None:
        """Re-fit each stage's codewords to the mean of ``x`` minus the other stages
        (codes held fixed)."""
        k = self.codebook_size
        shards = Shards.of(x)  # this process's rows under torch.distributed
        residual = x - self._decode(codes)
        for m in range(self.num_quantizers):
            cb = self.codebooks[m]
            target = residual + cb.index_select(0, codes[:, m])
            sums = torch.zeros_like(cb).index_add_(0, codes[:, m], target)
            counts = torch.zeros(k, device=x.device).index_add_(
                0, codes[:, m], torch.ones(x.shape[0], device=x.device)
            )
            sums, counts = shards.all_sum(sums, counts)
            new = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1.0)[:, None], cb)
            residual = target - new.index_select(0, codes[:, m])
            cb.copy_(new)

    # -- coding -----------------------------------------------------------------------------
    def _beam_step(self, codes, residuals, m: int, beam: int):
        """Extend every partial encoding by stage m and keep the ``beam`` best.

        Args:
            codes: int64 [n, B, m]; residuals: float32 [n, B, d].

        Returns:
            codes [n, B', m+1], residuals [n, B', d], errors [n, B'] (sorted ascending).
        """
        n, b, d = residuals.shape
        cb = self.codebooks[m].float()
        k = cb.shape[0]
        r2 = (residuals * residuals).sum(-1, keepdim=True)
        dist = torch.addmm((cb * cb).sum(-1), residuals.reshape(n * b, d), cb.T, alpha=-2.0)
        dist = dist.reshape(n, b, k) + r2  # [n, B, K]
        keep = min(beam, b * k)
        err, flat = torch.topk(dist.reshape(n, b * k), keep, dim=1, largest=False, sorted=True)
        parent, code = flat // k, flat % k
        codes = torch.cat(
            [codes.gather(1, parent[..., None].expand(n, keep, m)), code[..., None]], dim=2
        )
        residuals = residuals.gather(1, parent[..., None].expand(n, keep, d)) - cb[code]
        return codes, residuals, err

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        if self.beam_size == 1:
            return self._encode_greedy(x)
        if not is_eager() or x.shape[0] == 0:
            return self._encode_beam(x)
        rows = max(1, (1 << 20) // (self.beam_size * self.codebook_size))
        return torch.cat([self._encode_beam(x[s : s + rows]) for s in range(0, x.shape[0], rows)])

    def _encode_greedy(self, x: torch.Tensor) -> torch.Tensor:
        residual = x.float()
        codes = []
        for m in range(self.num_quantizers):
            cb = self.codebooks[m].float()
            idx = nearest(residual, cb).indices
            residual = residual - cb.index_select(0, idx)
            codes.append(idx)
        return torch.stack(codes, dim=1)

    def _encode_beam(self, x: torch.Tensor) -> torch.Tensor:
        codes = torch.zeros(x.shape[0], 1, 0, dtype=torch.long, device=x.device)
        residuals = x.float()[:, None, :]
        for m in range(self.num_quantizers):
            codes, residuals, _ = self._beam_step(codes, residuals, m, self.beam_size)
        return codes[:, 0]

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        if _cpu.fast_path(codes):
            out = _cpu.empty((codes.shape[0], self.dim))
            kernels.additive_decode(
                codes.contiguous().numpy(), self.codebooks.float().contiguous().numpy(), out.numpy()
            )
            return out
        flat = (codes.long() + self._offsets).reshape(-1)
        words = self.codebooks.float().reshape(-1, self.dim).index_select(0, flat)
        return words.reshape(-1, self.num_quantizers, self.dim).sum(dim=1)

    def _tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        cb = self.codebooks.float()  # [Q, K, d]
        dots = torch.einsum("nd,qkd->nqk", queries, cb)
        if metric == "ip":
            return dots
        tables = (cb * cb).sum(-1)[None] - 2.0 * dots
        tables[:, 0] += (queries * queries).sum(-1, keepdim=True)
        return tables

    def norms(self, codes) -> torch.Tensor:
        """``||x̂||²`` of the reconstructions of ``codes`` [..., Q] → float32 [...]."""
        x_hat = torch.as_tensor(self.decode(codes))
        return (x_hat * x_hat).sum(-1)

    def codeword_norm_sums(self, codes) -> torch.Tensor:
        """``Σ_m ||c_m||²`` over the codewords named by ``codes`` [..., Q] → float32 [...]."""
        c = torch.as_tensor(codes).long().to(self.device)
        norms = (self.codebooks.float() ** 2).sum(-1).reshape(-1)
        return norms[c + self._offsets].sum(-1)
