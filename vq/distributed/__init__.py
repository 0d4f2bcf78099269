"""Scale out with torch.distributed (launched with torchrun): one algorithm whether the vectors
sit in one process or are split over many.

- Training: with a process group initialised, :func:`vq.kmeans`, :func:`vq.lbg` and every
  quantizer's ``fit`` (hence every index's ``train``) take each process's vectors as its shard of
  the concatenation in rank order, and give every process the centroids one process holding all
  the vectors would get (to float rounding): subsampling and seeding draw global row numbers
  with the same generator everywhere, each Lloyd iteration all-reduces the cluster sums and
  counts, and the update runs identically on every process. :func:`use_group` picks the group
  for all training, a quantizer layer's training ``forward`` included (``use_group(None)``:
  each process trains alone, e.g. on replicated data under DDP).
- :class:`ShardedIndex`: each process adds its vectors to its own index with global ids; a
  search all-gathers every shard's top-k and returns the global top-k; ``save`` / ``load`` write
  one file per shard plus a manifest.
- :func:`checkpoints`: long training checkpoints itself every N iterations (safetensors + JSON,
  atomic), so that a group restarted by ``torchrun --max-restarts`` resumes and ends with the
  result of an uninterrupted run.
- ``python -m vq.distributed build|search``: the torchrun entry point (see its ``--help``);
  :func:`init_process_group` joins torchrun's group (gloo on CPU, nccl for CUDA tensors).

Without torch.distributed (or with one process) everything runs as in a single process, with no
communication and no cost.

The process-group rule, :class:`Shards`, the collectives and the checkpoints live one floor
down, in :mod:`vq.parallel` (which clustering and the quantizers build on); this package adds
what sits above the indexes — :class:`ShardedIndex`, joining torchrun's group, the command
line — and re-exports the rest, so ``vq.distributed`` is the one namespace users need.
"""

from vq.distributed.launch import default_backend, init_process_group
from vq.distributed.sharded import ShardedIndex, merge_topk
from vq.parallel import Shards, checkpoints, current_group, use_group

__all__ = [
    "ShardedIndex",
    "Shards",
    "checkpoints",
    "current_group",
    "default_backend",
    "init_process_group",
    "merge_topk",
    "use_group",
]
