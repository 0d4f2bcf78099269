"""Product quantization: M independent sub-quantizers on M slices of the vector.

As a layer (``learning=...``), each of the M sub-codebooks learns from its own slice of the
input: one codebook per group.

Reference: H. Jégou, M. Douze, C. Schmid, "Product quantization for nearest neighbor search",
IEEE TPAMI 2011.
"""

from __future__ import annotations

import numpy as np
import torch

from vq import _cpu, kernels
from vq._checks import in_chunks, is_eager
from vq.clustering.lloyd import update_centroids
from vq.clustering.seeding import generator, kmeans_plus_plus
from vq.distances import chunk_rows
from vq.parallel import Shards
from vq.quantizers.base import Quantizer
from vq.quantizers.codec import Metric
from vq.quantizers.layer import Step
from vq.quantizers.learning import Learning


class ProductQuantizer(Quantizer):
    """M sub-quantizers of ``dim / M`` dimensions with ``2**nbits`` centroids each.

    Args:
        dim: vector dimension d, a multiple of M.
        M: number of sub-quantizers (bytes per vector when nbits=8).
        nbits: bits per sub-code, 1–16.
        niter: Lloyd iterations (all M sub-quantizers advance together, one pass per iteration).
        init: "k-means++" or "random" seeding of each sub-codebook.
        seed: seeds sampling and seeding.
        max_points_per_centroid: train on at most ``2**nbits * max_points_per_centroid`` vectors.
        learning, commitment_weight, rotation_trick, cosine, channel_first: layer options (see
            :class:`vq.Quantizer`); cosine codebooks normalise every sub-vector. (No
            ``codebook_dim``: put a linear layer before the quantizer to change dimension.)

    Buffers:
        codebooks: float32 [M, 2**nbits, d / M] (an ``nn.Parameter`` under gradient learning).

    Codes are ``[..., M]``; ``distance_tables`` is ``[nq, M, 2**nbits]`` and summing
    ``table[m, code_m]`` gives ``||q - x̂||²`` (l2) or ``⟨q, x̂⟩`` (ip) exactly.
    """

    def __init__(
        self,
        dim: int,
        M: int,
        nbits: int = 8,
        *,
        niter: int = 25,
        init: str = "k-means++",
        seed: int = 1234,
        max_points_per_centroid: int = 256,
        learning: str | Learning | None = None,
        commitment_weight: float = 1.0,
        rotation_trick: bool = False,
        cosine: bool = False,
        channel_first: bool = False,
    ):
        if M <= 0 or dim % M != 0:
            raise ValueError(
                f"dim={dim} must be a positive multiple of M={M} (sub-vector size dim/M)"
            )
        if not 1 <= nbits <= 16:
            raise ValueError(f"nbits must be between 1 and 16, got {nbits}")
        if init not in ("k-means++", "random"):
            raise ValueError(f"init must be 'k-means++' or 'random', got {init!r}")
        super().__init__(
            dim,
            1 << nbits,
            (M,),
            commitment_weight=commitment_weight,
            rotation_trick=rotation_trick,
            cosine=cosine,
            channel_first=channel_first,
        )
        self.M, self.nbits, self.dsub = M, nbits, dim // M
        self.niter, self.init, self.seed = niter, init, seed
        self.max_points_per_centroid = max_points_per_centroid
        self._init_codebooks("codebooks", (M, 1 << nbits, dim // M), learning)
        # a list, not arange: torch.arange on the meta device (where load_index checks shapes)
        # imports sympy, half a second
        offsets = torch.tensor([m << nbits for m in range(M)])
        self.register_buffer("_offsets", offsets, persistent=False)

    @property
    def ksub(self) -> int:
        return self.codebook_size

    def config(self) -> dict:
        """The constructor arguments (JSON-serialisable), as indexes save them."""
        return {
            "M": self.M,
            "nbits": self.nbits,
            "niter": self.niter,
            "init": self.init,
            "seed": self.seed,
            "max_points_per_centroid": self.max_points_per_centroid,
        }

    # -- training ---------------------------------------------------------------------------
    def _fit(self, x: torch.Tensor) -> None:
        gen = generator(self.seed)
        # under torch.distributed x is this process's shard (see vq.distributed.Shards)
        train = Shards.of(x).subsample(self.ksub * self.max_points_per_centroid, gen).float()
        subs = train.local.reshape(-1, self.M, self.dsub)
        init = torch.empty_like(self.codebooks, dtype=torch.float32)
        for m in range(self.M):
            if self.init == "random":
                init[m] = train.with_local(subs[:, m]).sample(self.ksub, gen)
            else:
                init[m] = kmeans_plus_plus(train.with_local(subs[:, m]), self.ksub, gen)
        self.codebooks.copy_(init)
        self.mark_trained()
        self.lloyd(train, self.niter, gen)

    def lloyd(
        self, x: torch.Tensor | Shards, niter: int, gen: torch.Generator | None = None
    ) -> list[float]:
        """Run ``niter`` Lloyd iterations from the current codebooks (warm start, used by OPQ).

        Args:
            x: float32 Tensor[n, dim] on the module's device, or :class:`vq.distributed.Shards`
                of such rows (trains with the other processes on all their rows).

        Returns:
            The total squared error at each assignment step.
        """
        gen = gen if gen is not None else generator(self.seed)
        shards = x if isinstance(x, Shards) else Shards.whole(x)
        x = shards.local
        M, ksub, dsub = self.codebooks.shape
        rows = x.reshape(-1, dsub)  # sub-vectors, in the order of the flattened codes
        objective = []
        for _ in range(niter):
            codes, err = self._assign(x)
            flat = (codes.long() + self._offsets).reshape(-1)
            sums = torch.zeros(M * ksub, dsub, device=x.device).index_add_(0, flat, rows)
            counts = torch.bincount(flat, minlength=M * ksub).to(torch.float32)
            sums, counts, total = shards.all_sum(sums, counts, err.double().sum())
            objective.append(float(total))
            old = self.codebooks.float()
            sums, counts = sums.reshape(M, ksub, dsub), counts.reshape(M, ksub)
            new = torch.stack([update_centroids(old[m], sums[m], counts[m], gen) for m in range(M)])
            self.codebooks.copy_(new)
        return objective

    # -- coding -----------------------------------------------------------------------------
    def kernels_ahead(self) -> None:
        """Start compiling the CPU encoding kernel in the background
        (:func:`vq.kernels.pq_encoder_ahead`), for an index whose training encodes after it
        compiles other kernels (its coarse k-means); nothing on another device."""
        if self.codebooks.device.type == "cpu":
            kernels.pq_encoder_ahead(self.dsub, self.M, _cpu.numpy_dtype(self.code_dtype))

    def _assign(
        self, x: torch.Tensor, with_errors: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes [n, M] (``code_dtype`` on the CPU fast path, int64 otherwise) and the squared
        reconstruction errors float32 [n] (empty when ``with_errors`` is False on CPU)."""
        cb = self.codebooks.detach().float()
        if _cpu.fast_path(x):
            x = x.contiguous()
            codes = _cpu.empty((x.shape[0], self.M), self.code_dtype)
            err = _cpu.empty((x.shape[0] if with_errors else 0,))
            cbt = (-2.0 * cb).transpose(1, 2).contiguous()
            norms = (cb * cb).sum(-1)
            kernels.pq_encoder(self.dsub)(
                x.numpy(), cbt.numpy(), norms.numpy(), codes.numpy(), err.numpy()
            )
            return codes, err
        if not is_eager():  # one static-shape graph
            return self._assign_torch(x, cb)
        rows = max(1, chunk_rows(self.M * self.ksub, x.device))
        parts = [self._assign_torch(x[s : s + rows], cb) for s in range(0, x.shape[0], rows)]
        if not parts:
            return x.new_zeros(0, self.M, dtype=torch.long), x.new_zeros(0)
        return torch.cat([c for c, _ in parts]), torch.cat([e for _, e in parts])

    def _assign_torch(self, x: torch.Tensor, cb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        val, idx = partial_distances(x, cb).min(dim=-1)  # [M, n]
        subs = x.reshape(-1, self.M, self.dsub).transpose(0, 1)  # [M, n, dsub]
        err = (val + (subs * subs).sum(-1)).clamp_min(0.0).sum(0)
        return idx.T, err

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        if _cpu.fast_path(x):
            return self._assign(x, with_errors=False)[0]
        rows = max(1, chunk_rows(self.M * self.ksub, x.device))
        return in_chunks(lambda chunk: pq_encode(chunk, self.codebooks.detach().float()), x, rows)

    def static_encode(self, x: torch.Tensor) -> torch.Tensor:
        """``encode`` as one static-shape graph: the code space (cosine normalisation of the
        sub-vectors), then :func:`pq_encode`. What ``encode`` runs (chunk by chunk) for CUDA
        tensors, under ``vq._cpu.torch_only()`` and in compiled graphs, and what
        :mod:`vq.export` writes out.

        Args:
            x: float32 Tensor[n, dim].

        Returns:
            int64 Tensor[n, M].
        """
        return pq_encode(self._code_space(x), self.codebooks.detach().float())

    def static_decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``decode`` as one static-shape graph: integer codes Tensor[n, M] → float32
        Tensor[n, dim] (:func:`pq_decode`)."""
        return pq_decode(codes, self.codebooks.detach().float())

    def _lean_encoder(self):
        cb = self.codebooks.detach().float()
        cbt = (-2.0 * cb).transpose(1, 2).contiguous().numpy()
        norms = (cb * cb).sum(-1).numpy()
        norm_max = norms.max(axis=1)
        kernel = kernels.pq_encoder_lean(self.dsub)
        dtype = _cpu.numpy_dtype(self.code_dtype)
        M = self.M

        def encode(x: np.ndarray):
            codes = np.empty((x.shape[0], M), dtype)
            return codes if kernel(x, cbt, norms, norm_max, codes) else None

        return encode

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        cb = self.codebooks.detach().float()
        if _cpu.fast_path(codes):
            out = _cpu.empty((codes.shape[0], self.dim))
            kernels.pq_decoder(self.dsub)(
                codes.contiguous().numpy(), cb.contiguous().numpy(), out.numpy()
            )
            return out
        return pq_decode(codes, cb)

    # -- the layer --------------------------------------------------------------------------
    def _codebook_groups(self) -> torch.Tensor:
        return self.codebooks

    # stack/cat rather than reshape + transpose: AOT autograd turns the backward of a reshape
    # into a view, which fails on the transposed gradient under torch.compile
    def _group_rows(self, z: torch.Tensor) -> torch.Tensor:
        return torch.stack(z.split(self.dsub, dim=-1))

    def _ungroup(self, slices: torch.Tensor) -> torch.Tensor:
        return torch.cat(slices.unbind(0), dim=-1)

    def _normalize(self, z: torch.Tensor) -> torch.Tensor:
        subs = torch.nn.functional.normalize(z.reshape(*z.shape[:-1], self.M, self.dsub), dim=-1)
        return subs.reshape(z.shape)

    def _quantize(self, z, weight, lead, update) -> Step:
        return self._quantize_groups(z, weight, update)

    def tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        """float32 queries [nq, dim] → tables [nq, M, ksub] (:func:`lookup_tables`)."""
        tables = lookup_tables(queries, self.codebooks.detach().float(), metric)
        return tables.transpose(0, 1).contiguous()


# -- the static-shape graphs: encode's and decode's torch path, the indexes' look-up tables ------
def partial_distances(x: torch.Tensor, codebooks: torch.Tensor) -> torch.Tensor:
    """``||c||² - 2⟨x_m, c⟩`` of every sub-vector and codeword (the squared distance less
    ``||x_m||²``): x float32 Tensor[n, M * dsub], codebooks float32 Tensor[M, ksub, dsub] →
    float32 Tensor[M, n, ksub], one batched matrix product."""
    M, _, dsub = codebooks.shape
    subs = x.reshape(-1, M, dsub).transpose(0, 1)  # [M, n, dsub]
    norms = (codebooks * codebooks).sum(-1)[:, None, :]  # [M, 1, ksub]
    return torch.baddbmm(norms, subs, codebooks.transpose(1, 2), alpha=-2.0)


def pq_encode(x: torch.Tensor, codebooks: torch.Tensor) -> torch.Tensor:
    """Product-quantizer codes as one static-shape graph (MatMul and ArgMin in ONNX): x float32
    Tensor[n, M * dsub], codebooks float32 Tensor[M, ksub, dsub] → int64 Tensor[n, M], the
    nearest codeword of each sub-vector (lowest index among exact ties)."""
    return partial_distances(x, codebooks).argmin(dim=2).T


def pq_decode(codes: torch.Tensor, codebooks: torch.Tensor) -> torch.Tensor:
    """Reconstructions as one static-shape graph (one Gather): integer codes Tensor[n, M],
    codebooks float32 Tensor[M, ksub, dsub] → float32 Tensor[n, M * dsub]."""
    M, ksub, dsub = codebooks.shape
    offsets = torch.arange(M, device=codes.device) * ksub  # a constant of the graph
    flat = (codes.long() + offsets).reshape(-1)
    return codebooks.reshape(-1, dsub).index_select(0, flat).reshape(-1, M * dsub)


def lookup_tables(queries: torch.Tensor, codebooks: torch.Tensor, metric: Metric) -> torch.Tensor:
    """ADC look-up tables as one static-shape graph, laid out per sub-quantizer.

    Args:
        queries: float32 Tensor[B, M * dsub]; codebooks: float32 Tensor[M, ksub, dsub].
        metric: "l2" (``||q_m - c||²``, clamped at 0) or "ip" (``⟨q_m, c⟩``).

    Returns:
        float32 Tensor[M, B, ksub]: summing ``table[m, :, code_m]`` over m gives ``||q - x̂||²``
        or ``⟨q, x̂⟩``.
    """
    M, _, dsub = codebooks.shape
    subs = queries.reshape(-1, M, dsub).transpose(0, 1)  # [M, B, dsub]
    dots = torch.bmm(subs, codebooks.transpose(1, 2))  # [M, B, ksub]
    if metric == "ip":
        return dots
    norms = (codebooks * codebooks).sum(-1)[:, None, :]
    return ((subs * subs).sum(-1, keepdim=True) - 2.0 * dots + norms).clamp_min(0.0)
