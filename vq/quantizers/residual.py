"""Residual (multi-stage) vector quantization, with greedy or beam-search encoding.

Stage m quantizes what stages 0..m-1 left over; x̂ is the sum of one codeword per stage.
Beam search keeps the ``beam_size`` best partial encodings at each stage instead of the single
greedy one (faiss ResidualQuantizer's ``max_beam_size``). As a layer (``learning=...``) every
stage learns from the residuals it sees, and quantizer dropout trains bitrate-scalable codes.

References:
    B.-H. Juang, A. H. Gray, "Multiple stage vector quantization for speech coding", ICASSP 1982.
    Y. Chen, T. Guan, C. Wang, "Approximate nearest neighbor search by residual vector
    quantization", Sensors 2010.
    N. Zeghidour et al., "SoundStream: an end-to-end neural audio codec", IEEE/ACM TASLP 2021;
    R. Kumar et al., "High-fidelity audio compression with improved RVQGAN" (DAC), NeurIPS 2023
    (quantizer dropout).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from vq import _cpu, kernels
from vq._checks import as_codes, is_eager, like_input
from vq.clustering import _generator, kmeans
from vq.distances import nearest
from vq.parallel import Shards, sync
from vq.quantizers.base import Metric, Quantizer, Step
from vq.quantizers.functional import (
    code_counts,
    rotation_trick,
    row_norms,
    straight_through_loss,
    training_rows,
)
from vq.quantizers.learning import Learning


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
        quantizer_dropout: probability that a training sample is quantized by only its first
            ``n`` stages, ``n`` uniform in [dropout_min_stages, Q] per sample (SoundStream,
            DAC): the decoder learns to reconstruct from any prefix, so one model serves every
            bitrate (``decode(codes, num_stages=n)``). Applies in training mode only.
        dropout_min_stages: the fewest stages a dropped-out sample keeps.
        learning, commitment_weight, rotation_trick, codebook_dim, channel_first: layer
            options (see :class:`vq.Quantizer`); one projection pair surrounds the whole stack.
            Cosine codebooks do not apply: residuals carry their norms.

    Buffers:
        codebooks: float32 [Q, K, code_dim] (an ``nn.Parameter`` under gradient learning).

    As a layer, ``forward`` in training mode assigns greedily stage by stage (each stage
    k-means-initialised on its first residuals and updated on them); encoding, and ``forward``
    in eval mode, use ``beam_size``.

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
        quantizer_dropout: float = 0.0,
        dropout_min_stages: int = 1,
        learning: str | Learning | None = None,
        commitment_weight: float = 1.0,
        rotation_trick: bool = False,
        codebook_dim: int | None = None,
        channel_first: bool = False,
    ):
        if num_quantizers < 1:
            raise ValueError(f"num_quantizers must be >= 1, got {num_quantizers}")
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        if not 0.0 <= quantizer_dropout <= 1.0:
            raise ValueError(f"quantizer_dropout must lie in [0, 1], got {quantizer_dropout}")
        if not 1 <= dropout_min_stages <= num_quantizers:
            raise ValueError(
                f"dropout_min_stages must lie in [1, num_quantizers={num_quantizers}], "
                f"got {dropout_min_stages}"
            )
        super().__init__(
            dim,
            codebook_size,
            (num_quantizers,),
            commitment_weight=commitment_weight,
            rotation_trick=rotation_trick,
            codebook_dim=codebook_dim,
            channel_first=channel_first,
        )
        self.quantizer_dropout, self.dropout_min_stages = quantizer_dropout, dropout_min_stages
        if refine_iters < 0:
            raise ValueError(f"refine_iters must be >= 0, got {refine_iters}")
        self.num_quantizers, self.beam_size, self.refine_iters = (
            num_quantizers,
            beam_size,
            refine_iters,
        )
        self.niter, self.init, self.seed = niter, init, seed
        self.max_points_per_centroid = max_points_per_centroid
        self._init_codebooks("codebooks", (num_quantizers, codebook_size, self.code_dim), learning)
        self.register_buffer(
            "_offsets",
            torch.tensor([q * codebook_size for q in range(num_quantizers)]),  # not arange: meta
            persistent=False,
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
                residuals.reshape(-1, self.code_dim),
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
        cb = self.codebooks.detach().float()
        if _cpu.fast_path(codes):
            out = _cpu.empty((codes.shape[0], self.code_dim))
            codes_np, cb_np = codes.contiguous().numpy(), cb.contiguous().numpy()
            kernels.additive_decode(codes_np, cb_np, out.numpy())
            return out
        flat = (codes.long() + self._offsets).reshape(-1)
        words = cb.reshape(-1, self.code_dim).index_select(0, flat)
        return words.reshape(-1, self.num_quantizers, self.code_dim).sum(dim=1)

    def decode(self, codes: Any, num_stages: int | None = None) -> Any:
        """Reconstructions of integer ``codes`` [..., Q] → float [..., dim].

        Args:
            codes: integer codes [..., Q] (numpy or torch), or [..., num_stages].
            num_stages: decode from the first ``num_stages`` stages only (the coarser
                bitrates a model trained with quantizer dropout serves); None uses all Q.
        """
        if num_stages is None:
            return super().decode(codes)
        q = self.num_quantizers
        if not 1 <= num_stages <= q:
            raise ValueError(f"num_stages must lie in [1, {q}], got {num_stages}")
        self._require_trained("decode")
        c = as_codes(codes, None, self.codebook_size)
        if c.dim() == 0 or c.shape[-1] not in (q, num_stages):
            raise ValueError(
                f"codes: expected codes [..., {q}] or [..., {num_stages}] for num_stages="
                f"{num_stages}, got shape {tuple(c.shape)}"
            )
        lead = c.shape[:-1]
        c = c[..., :num_stages].reshape(-1, num_stages).to(self.device).long()
        with torch.no_grad():
            cb = self.codebooks.detach().float()[:num_stages].reshape(-1, self.code_dim)
            words = cb.index_select(0, (c + self._offsets[:num_stages]).reshape(-1))
            x_hat = self._output_space(words.reshape(-1, num_stages, self.code_dim).sum(dim=1))
        return like_input(x_hat.reshape(*lead, self.dim), codes)

    # -- the layer --------------------------------------------------------------------------
    def _codebook_groups(self) -> torch.Tensor:
        return self.codebooks

    def _stage_mask(
        self, lead: tuple[int, ...], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Quantizer dropout: stages per sample, int64 [B] (B = the first axis of the batch),
        and which stages each row keeps, float [n, Q] (None when every row keeps all)."""
        q = self.num_quantizers
        batch = lead[0] if lead else 1
        per_sample = math.prod(lead[1:]) if lead else 1
        stages = torch.full((batch,), q, dtype=torch.long, device=device)
        if not (self.training and self.quantizer_dropout > 0):
            return stages, None
        drop = torch.rand(batch, device=device) < self.quantizer_dropout
        fewer = torch.randint(self.dropout_min_stages, q + 1, (batch,), device=device)
        stages = torch.where(drop, fewer, stages)
        keep = (torch.arange(q, device=device) < stages[:, None]).float()  # [B, Q]
        return stages, keep[:, None, :].expand(batch, per_sample, q).reshape(-1, q)

    def _quantize(self, z, weight, lead, update) -> Step:
        """Stage by stage: stage m quantizes r_m = z - (stages 0..m-1) and, when learning,
        initialises on and learns from r_m. The commitment loss is the mean over stages of
        ``||z - sg(P_m)||²`` (P_m: the reconstruction through stage m), as in EnCodec; its
        gradient ``2 Σ_m (z - P_m) / N`` accumulates in place, stage by stage."""
        n, d = z.shape
        learner, size = self.learner, self.codebook_size
        synced = update and sync.active()
        stages, keep = self._stage_mask(lead, z.device)
        codebooks = self._codebook_groups()
        zd = z.detach()
        if not update:
            with torch.no_grad():
                fixed = self._encode(zd).long()  # beam search when configured
        residual = zd.clone()  # r_m, updated in place
        pull = torch.zeros_like(zd)  # Σ_m w_m r_{m+1}
        kept = None if keep is None else torch.zeros_like(zd)  # the stages each row keeps
        squares, cb_squares, count = zd.new_zeros(()), zd.new_zeros(()), zd.new_zeros(())
        codes, counts = [], []
        for m in range(self.num_quantizers):
            w = weight if keep is None else (keep[:, m] if weight is None else keep[:, m] * weight)
            own = slice(m, m + 1)
            if update:
                learner.initialize(codebooks[own].detach(), residual[None], w, own, synced)
                with torch.no_grad():
                    cb, rows = codebooks[m].detach().float(), training_rows(size)
                    c = nearest(residual, cb, rows, x_norms=row_norms(residual)).indices
            else:
                c = fixed[:, m]
            q = codebooks[m].float().index_select(0, c)
            if learner is not None and learner.by_gradient:
                cb_err = ((residual - q) ** 2).sum(-1)
                cb_squares = cb_squares + (cb_err if w is None else cb_err * w).sum()
            codes.append(c)
            counts.append(code_counts(c[None], size, w))
            if update:  # r_m and its codes, before r_m moves on
                learner.update(codebooks[own].detach(), residual[None], c[None], w, own, synced)
            q = q.detach()
            residual.sub_(q)  # r_{m+1}
            if w is None:
                flat = residual.reshape(-1)
                squares, count = squares + torch.dot(flat, flat), count + n
                pull.add_(residual)
            else:
                squares, count = squares + (row_norms(residual) * w).sum(), count + w.sum()
                pull.addcmul_(residual, w[:, None])
            if kept is not None:
                kept.addcmul_(q, keep[:, m, None])
        if kept is None:
            kept = zd - residual  # every stage: z - r_Q
        denom = (count * d).clamp_min(1.0)
        quantized, commitment = straight_through_loss(z, kept, squares / denom, pull, 2 / denom)
        if self.rotation_trick:
            quantized = rotation_trick(z, kept)
        return Step(
            quantized,
            torch.stack(codes, dim=1),
            commitment,
            cb_squares / denom,
            torch.cat(counts),
            stages,
        )

    def _tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        cb = self._output_codebooks()  # [Q, K, d]
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
        norms = (self._output_codebooks() ** 2).sum(-1).reshape(-1)
        return norms[c + self._offsets].sum(-1)
