"""Scale out with torch.distributed (launch with torchrun): distributed codebook training,
sharded indexes, checkpoints for restarts."""

from vq.distributed.checkpoint import checkpoints
from vq.distributed.shards import Shards, current_group, use_group

__all__ = ["Shards", "checkpoints", "current_group", "use_group"]
