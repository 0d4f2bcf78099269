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

import torch
import torch.nn.functional as F

from vq import _cpu, kernels
from vq._checks import in_chunks
from vq.clustering import kmeans
from vq.clustering.seeding import generator
from vq.distances import chunk_rows, nearest
from vq.parallel import Shards, sync
from vq.quantizers.additive import additive_tables, beam_step, residual_decode, residual_encode
from vq.quantizers.base import Quantizer
from vq.quantizers.codec import Metric
from vq.quantizers.functional import (
    code_counts,
    rotation_trick,
    row_norms,
    stage_estimate,
    straight_through_loss,
    training_rows,
)
from vq.quantizers.layer import Step
from vq.quantizers.learning import Learning, check_fittable
from vq.quantizers.stages import Stages, check_stage_options
from vq.quantizers.vector import nearest_codeword


class ResidualVQ(Stages, Quantizer):
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
            ``learning="simvq"`` (:class:`vq.SimVQ`) gives every stage its own frozen random
            codebook and learned linear map (vector-quantize-pytorch's ``ResidualSimVQ``).
        cosine: cosine-similarity stages (vector-quantize-pytorch's ``use_cosine_sim``): the
            input is l2-normalised, every stage's codewords are unit vectors and stage m picks
            the codeword nearest to its l2-normalised residual (and learns from those); the
            reconstruction is the sum of the chosen unit codewords. Greedy only
            (``beam_size=1``): beam search ranks paths by squared error.
        per_stage_gradient: how the output's gradient reaches the input in training. False
            (EnCodec's): one estimator for the whole stack, straight through (the identity)
            or, with ``rotation_trick``, one rotation of ``z`` onto the reconstruction. True
            (vector-quantize-pytorch's ``ResidualVQ`` and ``ResidualSimVQ``): every kept stage
            passes its own residual's gradient, straight through or rotated onto its own
            codeword (:func:`stage_estimate`), and the input's gradient is their sum (Q × the
            identity when straight through).

    Buffers:
        codebooks: float32 [Q, K, code_dim] (an ``nn.Parameter`` under gradient learning; the
        frozen random codebooks under :class:`vq.SimVQ`, with ``codebook_transform`` [Q,
        code_dim, code_dim] the learned maps).

    As a layer, ``forward`` in training mode encodes as ``encode`` does — greedily stage by
    stage, or by beam search when ``beam_size`` > 1 — each stage k-means-initialised on its
    first residuals (beam search: those of the best partial encoding) and updated on the
    residuals of the codes chosen.

    Codes are ``[..., Q]``. ``distance_tables`` is ``[nq, Q, K]``: for "ip" the tables sum to
    ⟨q, x̂⟩; for "l2" they sum to ``||q||² - 2⟨q, x̂⟩ + Σ_m ||c_m||²``, which lacks the cross terms
    ``2 Σ_{i<j} ⟨c_i, c_j⟩`` of ``||x̂||²`` — add :meth:`norms` of the codes (``||x̂||²``) and
    subtract ``Σ_m ||c_m||²`` (:meth:`codeword_norm_sums`) for the exact squared distance, as
    faiss stores norms beside residual codes.
    """

    simvq_learning = True

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
        cosine: bool = False,
        codebook_dim: int | None = None,
        channel_first: bool = False,
        per_stage_gradient: bool = False,
    ):
        check_stage_options(num_quantizers, quantizer_dropout, dropout_min_stages)
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        if cosine and beam_size > 1:
            raise ValueError(
                "cosine stages choose codewords greedily by angle; beam search ranks paths by "
                "squared error: use beam_size=1 with cosine=True"
            )
        super().__init__(
            dim,
            codebook_size,
            (num_quantizers,),
            commitment_weight=commitment_weight,
            rotation_trick=rotation_trick,
            cosine=cosine,
            codebook_dim=codebook_dim,
            channel_first=channel_first,
        )
        if refine_iters < 0:
            raise ValueError(f"refine_iters must be >= 0, got {refine_iters}")
        self.num_quantizers, self.beam_size = num_quantizers, beam_size
        self.refine_iters, self.quantizer_dropout = refine_iters, quantizer_dropout
        self.dropout_min_stages = dropout_min_stages
        self.niter, self.init, self.seed = niter, init, seed
        self.max_points_per_centroid = max_points_per_centroid
        self.per_stage_gradient = bool(per_stage_gradient)
        self._init_codebooks("codebooks", (num_quantizers, codebook_size, self.code_dim), learning)

    # -- training ---------------------------------------------------------------------------
    def _fit(self, x: torch.Tensor) -> None:
        check_fittable(self)
        # every stage's k-means would subsample to this many vectors anyway; under
        # torch.distributed x is this process's shard: keep its part of the global sample
        gen = generator(self.seed)
        x = Shards.of(x).subsample(self.codebook_size * self.max_points_per_centroid, gen).local
        n = x.shape[0]
        codes, residuals = None, x[:, None, :].clone()  # codes [n, beam, m], residuals [n, beam, d]
        for m in range(self.num_quantizers):
            if self.cosine:  # greedy by angle: k-means of the unit residuals, unit centroids
                self._fit_cosine_stage(m, residuals[:, 0])
                continue
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
            cb, chunks = self.codebooks[m].float(), [slice(s, s + rows) for s in range(0, n, rows)]
            steps = [
                beam_step(None if codes is None else codes[c], residuals[c], cb, self.beam_size)
                for c in chunks
            ]
            codes = torch.cat([c for c, _, _ in steps])
            residuals = torch.cat([r for _, r, _ in steps])
        for _ in range(0 if self.cosine else self.refine_iters):
            self._refine(x, self._encode(x))

    def _fit_cosine_stage(self, m: int, residual: torch.Tensor) -> None:
        """Stage m of a cosine stack: unit k-means centroids of the unit residuals [n, d];
        the residuals move on in place."""
        unit = F.normalize(residual, dim=-1)
        result = kmeans(
            unit,
            self.codebook_size,
            niter=self.niter,
            init=self.init,
            seed=self.seed + m,
            max_points_per_centroid=self.max_points_per_centroid,
        )
        cb = F.normalize(result.centroids.float(), dim=-1)
        self.codebooks[m].copy_(cb)
        residual.sub_(cb.index_select(0, nearest_codeword(unit, cb)))

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
    def _codewords(self) -> torch.Tensor:
        """The codewords coded with, float32 [Q, K, code_dim] (see ``effective_codebooks``)."""
        return self.effective_codebooks().detach()

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        k, beam = self.codebook_size, self.beam_size
        rows = chunk_rows(k, x.device) if beam == 1 else max(1, (1 << 20) // (beam * k))
        cb = self._codewords()
        return in_chunks(lambda chunk: residual_encode(chunk, cb, beam, self.cosine), x, rows)

    def static_encode(self, x: torch.Tensor) -> torch.Tensor:
        """``encode`` as one static-shape graph, float32 Tensor[n, dim] → int64 Tensor[n, Q]:
        the code space (``project_in``), then :func:`residual_encode` (greedy or beam search,
        as ``beam_size`` says; by cosine for cosine stages). What ``encode`` and eval-mode
        ``forward`` run (chunk by chunk) off the CPU, under ``vq._cpu.torch_only()`` and in
        graphs, and what :mod:`vq.export` writes out."""
        cb = self._codewords()
        return residual_encode(self._code_space(x), cb, self.beam_size, self.cosine)

    def static_decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``decode`` as one static-shape graph: integer codes Tensor[n, Q] → float32
        Tensor[n, dim] (:func:`residual_decode`, then ``project_out``)."""
        return self._output_space(residual_decode(codes, self._codewords()))

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        cb = self._codewords()
        if _cpu.fast_path(codes):
            out = _cpu.empty((codes.shape[0], self.code_dim))
            codes_np, cb_np = codes.contiguous().numpy(), cb.contiguous().numpy()
            kernels.additive_decode(codes_np, cb_np, out.numpy())
            return out
        return residual_decode(codes, cb)

    def _decode_prefix(self, codes: torch.Tensor) -> torch.Tensor:
        return residual_decode(codes, self._codewords()[: codes.shape[-1]])

    # -- the layer --------------------------------------------------------------------------
    def _codebook_groups(self) -> torch.Tensor:
        return self.codebooks

    def _quantize(self, z, weight, lead, update) -> Step:
        stages, keep = self._stage_mask(lead, z.device)
        return self._quantize_stages(z, weight, stages, keep, update)

    def _quantize_stages(self, z, weight, stages, keep, update) -> Step:
        """Stage by stage: stage m quantizes r_m = z - (stages 0..m-1) (its l2-normalisation
        for cosine stages) and, when learning, initialises on and learns from it. The
        commitment loss is the mean over stages of ``||z - sg(P_m)||²`` (P_m: the
        reconstruction through stage m), as in EnCodec; its gradient ``2 Σ_m (z - P_m) / N``
        accumulates in place, stage by stage (the output's gradient: ``per_stage_gradient``)."""
        n, d = z.shape
        learner, size = self.learner, self.codebook_size
        synced = update and sync.active()
        codebooks = self._codebook_groups()
        zd = z.detach()
        words = None if self.codebook_transform is None else self.effective_codebooks()
        fixed = self._fixed_codes(zd, weight, keep, update, synced, words)
        residual = zd.clone()  # r_m, updated in place
        pull = torch.zeros_like(zd)  # Σ_m w_m r_{m+1}
        kept = None if keep is None else torch.zeros_like(zd)  # the stages each row keeps
        cb_squares = zd.new_zeros(())
        codes, counts, rotated = [], [], None  # rotated: Σ_m rotations of r_m onto q_m
        stage_squares, stage_rows = [], []  # Σ w ||r_{m+1}||² and Σ w of every stage
        for m in range(self.num_quantizers):
            w, own = _stage_weight(weight, keep, m), slice(m, m + 1)
            seen = F.normalize(residual, dim=-1) if self.cosine else residual
            if fixed is None:  # greedy training: initialise stage m, then its nearest codes
                learner.initialize(codebooks[own].detach(), seen[None], w, own, synced)
                with torch.no_grad():
                    cb, rows = self._stage_words(m, words).detach(), training_rows(size)
                    c = nearest(seen, cb, rows, x_norms=row_norms(seen)).indices
            else:
                c = fixed[:, m]
            q = self._stage_words(m, words).index_select(0, c)
            if learner is not None and learner.by_gradient:
                cb_err = ((seen - q) ** 2).sum(-1)
                cb_squares = cb_squares + (cb_err if w is None else cb_err * w).sum()
            codes.append(c)
            counts.append(code_counts(c[None], size, w))
            if update:  # r_m and its codes, before r_m moves on
                learner.update(codebooks[own].detach(), seen[None], c[None], w, own, synced)
            q = q.detach()
            if self.per_stage_gradient and self.rotation_trick:  # r_m, with z's gradient
                part = stage_estimate(z - (zd - residual), q, True, _keep(keep, m))
                rotated = part if rotated is None else rotated + part
            residual.sub_(q)  # r_{m+1}
            if w is None:
                flat = residual.reshape(-1)
                stage_squares.append(torch.dot(flat, flat))
                stage_rows.append(zd.new_full((), float(n)))
                pull.add_(residual)
            else:
                stage_squares.append((row_norms(residual) * w).sum())
                stage_rows.append(w.sum())
                pull.addcmul_(residual, w[:, None])
            if kept is not None:
                kept.addcmul_(q, keep[:, m, None])
        if kept is None:
            kept = zd - residual  # every stage: z - r_Q
        stage_squares, stage_rows = torch.stack(stage_squares), torch.stack(stage_rows)
        squares, count = stage_squares.sum(), stage_rows.sum()
        denom = (count * d).clamp_min(1.0)
        quantized, commitment = straight_through_loss(z, kept, squares / denom, pull, 2 / denom)
        if self.rotation_trick:
            quantized = rotated if self.per_stage_gradient else rotation_trick(z, kept)
        elif self.per_stage_gradient:  # Σ_m keep_m · identity: (kept stages - 1) more
            extra = z * ((self.num_quantizers if keep is None else keep.sum(1, True)) - 1)
            quantized = quantized + (extra - extra.detach())
        codes, counts = torch.stack(codes, dim=1), torch.cat(counts)
        per_stage = stage_squares / (stage_rows * d).clamp_min(1.0)
        return Step(
            quantized,
            codes,
            commitment,
            cb_squares / denom,
            counts,
            stages,
            stage_commitment=per_stage,
        )

    def _stage_words(self, m: int, words: torch.Tensor | None) -> torch.Tensor:
        """Stage m's codewords float32 [K, code_dim]: ``words[m]`` (SimVQ's, computed once per
        step), else the stored codebook (read after its initialisation)."""
        return self._codebook_groups()[m].float() if words is None else words[m]

    def _fixed_codes(self, zd, weight, keep, update, synced, words) -> torch.Tensor | None:
        """Codes int64 [n, Q] chosen before the training stage loop: ``encode``'s when not
        learning; beam search's when learning with ``beam_size`` > 1 (stage m k-means-
        initialised, once, on the residuals of the best partial encoding, then every partial
        encoding extended by it: :func:`beam_step`, as ``encode`` runs it); None for greedy
        learning, which chooses stage by stage."""
        if not update:
            with torch.no_grad():
                return self._encode(zd).long()  # beam search when configured
        if self.beam_size == 1:
            return None
        learner, codebooks = self.learner, self._codebook_groups()
        codes, residuals = None, zd[:, None, :]
        with torch.no_grad():
            for m in range(self.num_quantizers):
                best, own = residuals[:, 0].contiguous()[None], slice(m, m + 1)
                w = _stage_weight(weight, keep, m)
                learner.initialize(codebooks[own].detach(), best, w, own, synced)
                cb = self._stage_words(m, words).detach()
                codes, residuals, _ = beam_step(codes, residuals, cb, self.beam_size)
        return codes[:, 0]

    def tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        """float32 queries [nq, dim] → tables [nq, Q, K] (l2: see the class docstring)."""
        return additive_tables(queries, self._output_codebooks(), metric)

    def norms(self, codes) -> torch.Tensor:
        """``||x̂||²`` of the reconstructions of ``codes`` [..., Q] → float32 [...]."""
        x_hat = torch.as_tensor(self.decode(codes))
        return (x_hat * x_hat).sum(-1)

    def codeword_norm_sums(self, codes) -> torch.Tensor:
        """``Σ_m ||c_m||²`` over the codewords named by ``codes`` [..., Q] → float32 [...]."""
        c = torch.as_tensor(codes).long().to(self.device)
        norms = (self._output_codebooks() ** 2).sum(-1).reshape(-1)
        offsets = torch.arange(self.num_quantizers, device=c.device) * self.codebook_size
        return norms[c + offsets].sum(-1)


def _keep(keep: torch.Tensor | None, m: int) -> torch.Tensor | None:
    """Stage m's quantizer-dropout mask [n, 1] of the rows' ``keep`` [n, Q], or None."""
    return None if keep is None else keep[:, m, None]


def _stage_weight(weight, keep, m: int) -> torch.Tensor | None:
    """The weights float [n] of stage m's rows (padding and quantizer dropout), or None."""
    if keep is None:
        return weight
    return keep[:, m] if weight is None else keep[:, m] * weight
