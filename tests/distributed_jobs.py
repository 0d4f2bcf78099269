"""What the torchrun workers of test_distributed.py run, and the single-process references their
results are compared with: ``python -m torch.distributed.run --standalone --nproc_per_node=2
tests/distributed_jobs.py train <dir>`` (gloo on CPU, one thread per process) writes each
process's results to ``<dir>/rank<r>.safetensors`` and its errors to ``<dir>/errors<r>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.numpy import save_file

import vq
from vq.datasets import clustered_vectors
from vq.distributed import ShardedIndex, init_process_group, use_group
from vq.parallel import sync

N, DIM = 6000, 32
SPLIT = 2500  # rank 0 holds rows [0, 2500), rank 1 rows [2500, 6000): uneven on purpose
IVF = "IVF16,PQ8x6"  # 64 codewords per sub-space, fewer than the blobs


def dataset() -> np.ndarray:
    """100 tight, well-separated blobs: every codebook below has fewer codewords than blobs, so
    the boundaries between cells run through empty space. (On data with points within float
    rounding of a boundary, the sums' rounding — which differs with the number of processes —
    can move such a point, and Lloyd then follows another, equally good path.)"""
    return clustered_vectors(N, DIM, n_clusters=100, spread=0.1, seed=5)


def database() -> np.ndarray:
    """Wider blobs for the search checks (few exact ties among PQ distances)."""
    return clustered_vectors(N, DIM, n_clusters=40, spread=0.5, seed=7)


def queries() -> np.ndarray:
    return clustered_vectors(50, DIM, n_clusters=40, spread=0.6, seed=7)


def training_jobs(x) -> dict[str, np.ndarray]:
    """What the workers train on their shards and this process trains on all rows: name ->
    centroids / codebooks / rotation."""
    out = {
        "kmeans++ bounded": vq.kmeans(x, 80, niter=8).centroids,
        "kmeans random": vq.kmeans(x, 20, niter=8, init="random").centroids,
        "kmeans subsampled": vq.kmeans(x, 10, niter=6, max_points_per_centroid=64).centroids,
        "lbg": vq.lbg(x, 16, niter=4).centroids,
        "pq": vq.ProductQuantizer(DIM, 4, 6, niter=6).fit(x).codebooks,
        "pq random": vq.ProductQuantizer(DIM, 4, 5, niter=4, init="random").fit(x).codebooks,
        "rvq beam 2": vq.ResidualVQ(DIM, 2, 32, 2, niter=4, refine_iters=1).fit(x).codebooks,
    }
    opq = vq.OPQ(DIM, 4, 5, niter=2, niter_pq=2, niter_pq_0=3, pq_niter=3).fit(x)
    out["opq rotation"], out["opq codebooks"] = opq.rotation, opq.pq.codebooks
    ivfpq = vq.index_factory(DIM, IVF)
    ivfpq.train(x)
    out["ivfpq coarse"], out["ivfpq pq"] = ivfpq.quantizer.codebook, ivfpq.pq.codebooks
    return {name: np.asarray(v) for name, v in out.items()}


def layer_training(rank: int, compiled: bool = False) -> dict[str, np.ndarray]:
    """The buffers of an EMA VectorQuantizer (its step compiled, if asked), ResidualVQ (greedy,
    beam search, cosine stages) and GroupedResidualVQ after three training steps — k-means
    initialisation, EMA updates, dead-code restarts — on the data of process ``rank`` (other
    data on each process, the same initial state); and the parameters and buffers of SimVQ
    layers (ResidualVQ, VectorQuantizer) after three SGD steps on gradients averaged over the
    processes (as DDP does)."""
    gen = torch.Generator().manual_seed(100 + rank)
    ema = vq.EMA(decay=0.8, dead_code_threshold=1.0)
    out = {}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        layers = {
            "vq": vq.VectorQuantizer(8, 16, learning=ema),
            "rvq": vq.ResidualVQ(8, 2, 16, learning=ema),
            "grvq": vq.GroupedResidualVQ(8, 2, 2, 8, learning=ema, quantizer_dropout=0.5),
            "rvq-beam": vq.ResidualVQ(8, 2, 16, 2, learning=ema),
            "rvq-cosine": vq.ResidualVQ(8, 2, 16, learning=ema, cosine=True),
            "simvq": vq.ResidualVQ(8, 2, 16, learning="simvq", quantizer_dropout=0.5),
            "vq-simvq": vq.VectorQuantizer(8, 16, learning="simvq", rotation_trick=True),
        }
        for name, layer in layers.items():
            step = layer
            if compiled and name == "vq":
                step = torch.compile(layer, fullgraph=True, backend="aot_eager")
            for _ in range(3):
                x = torch.randn(2, 48 + 16 * rank, 8, generator=gen) * (1 + rank) + rank
                step(x.requires_grad_()).loss.backward()
                with torch.no_grad():
                    for p in layer.parameters():  # DDP's averaged gradients, an SGD step
                        grad = p.grad
                        if sync.active():
                            grad = sync.all_reduce_sum(grad) / sync.world_size()
                        p.sub_(0.1 * grad)
                        p.grad = None
            out.update({f"{name}.{k}": v.numpy() for k, v in layer.state_dict().items()})
    return out


def lfq_entropy(rank: int) -> dict[str, np.ndarray]:
    """A ResidualLFQ training step on the data of process ``rank``: its input and codebook
    entropies (per stage), whose batch distribution is over every process's vectors."""
    gen = torch.Generator().manual_seed(200 + rank)
    x = torch.randn(2, 48 + 16 * rank, 8, generator=gen) * 0.1
    out = vq.ResidualLFQ(8, 2, num_bits=8, inv_temperature=10.0)(x)
    return {"x": x.numpy(), "entropy": out.codebook_entropy.detach().numpy()}


# -- the torchrun worker ------------------------------------------------------------------------
def train(out: Path) -> None:
    """Training on shards, sharded search, errors raised on every process, layer training over
    the default group and inside use_group(None)."""
    rank = dist.get_rank()
    x, q = dataset(), queries()
    results = training_jobs(x[:SPLIT] if rank == 0 else x[SPLIT:])
    results.update({f"synced {k}": v for k, v in layer_training(rank).items()})
    results.update({f"synced lfq {k}": v for k, v in lfq_entropy(rank).items()})
    with use_group(None):
        results.update({f"local {k}": v for k, v in layer_training(rank).items()})
        results.update({f"local lfq {k}": v for k, v in lfq_entropy(rank).items()})
        compiled = layer_training(rank, compiled=True)
        results.update({f"compiled {k}": v for k, v in compiled.items() if k.startswith("vq.")})
    results["kmeans, rank 0 empty"] = vq.kmeans(x[:0] if rank == 0 else x, 70, niter=5).centroids
    # sharded indexes, on the rows the CLI test's build gives each process (an even split):
    # global ids, global top-k, saved per shard
    xb = database()
    mine = xb[: N // 2] if rank == 0 else xb[N // 2 :]
    for name, description in (("flat", "Flat"), ("ivfpq", IVF)):
        sharded = ShardedIndex(vq.index_factory(DIM, description))
        sharded.train(mine)
        sharded.add(mine)
        assert sharded.ntotal == N and sharded.local_ntotal == len(mine)
        params = {"nprobe": 4} if name == "ivfpq" else {}
        results[f"{name} D"], results[f"{name} I"] = sharded.search(q, 10, **params)
        sharded.save(out / f"{name}-shards")
    results["sharded coarse"] = sharded.index.quantizer.codebook.numpy()
    results["sharded pq"] = sharded.index.pq.codebooks.numpy()
    errors = []
    try:  # different queries on the two processes: an error on both, no hang
        sharded.search(q[: 10 + rank], 5)
    except ValueError as err:
        errors.append(str(err))
    try:  # a bad input on one process only: an error on both
        sharded.add(mine[:5, :-1] if rank == 1 else mine[:5])
    except ValueError as err:
        errors.append(str(err))
    save_file(results, str(out / f"rank{rank}.safetensors"))
    (out / f"errors{rank}.json").write_text(json.dumps(errors))


def main(argv: list[str]) -> None:
    """``train <dir>``, in a process that torchrun started."""
    jobs = {"train": train}
    torch.set_num_threads(1)
    assert init_process_group("gloo")
    jobs[argv[0]](Path(argv[1]))
    dist.barrier()  # nobody tears the group down while another process still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
