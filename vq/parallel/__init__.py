"""Process groups, sharded data, collectives and checkpoints: the floor that training stands on.

Everything that trains — :func:`vq.kmeans`, :func:`vq.lbg`, a quantizer's ``fit`` and a
quantizer layer's training ``forward`` — runs over the process group that :func:`current_group`
returns, one rule for all of them (:mod:`.groups`): the group chosen by the innermost
:func:`use_group` block, else torch.distributed's default group when it holds several
processes, else none. Over a group, ``fit``-style training takes each process's vectors as its
:class:`Shards` of the global data (:mod:`.shards`) and all-reduces per iteration with the eager
helpers of :mod:`.collectives`; layer training all-reduces its EMA statistics with the
``torch.compile``-traceable helpers of :mod:`.sync`. Long loops checkpoint themselves
(:class:`TrainingRun`, :func:`checkpoints`, :mod:`.checkpoint`) in files written atomically
(:mod:`.atomic`). This package sits just above the kernels: it imports nothing from clustering,
the quantizers, the indexes, export or :mod:`vq.distributed`, which builds sharded indexes and
the torchrun command line on top of it and re-exports its public names.
"""

from vq.parallel.checkpoint import TrainingRun, checkpoint_path, checkpoints
from vq.parallel.groups import CURRENT, current_group, use_group
from vq.parallel.shards import Shards

__all__ = [
    "CURRENT",
    "Shards",
    "TrainingRun",
    "checkpoint_path",
    "checkpoints",
    "current_group",
    "use_group",
]
