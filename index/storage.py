"""What the indexes share about their stored rows, below :class:`vq.index.Index`: the checks
of new ids."""

from __future__ import annotations

import torch


def check_new_ids(index, ids: torch.Tensor, what: str) -> None:
    """Refuse ids (non-negative, distinct) that ``index`` already stores."""
    if not index.ntotal or not ids.numel():
        return
    if index._sequential_ids():  # the stored ids are 0 … ntotal - 1: no search needed
        taken = ids < index.ntotal
    else:
        taken = torch.isin(ids, index.stored_ids())
    if bool(taken.any()):
        first = int(ids[torch.argmax(taken.to(torch.uint8))])
        raise ValueError(
            f"{what}: {int(taken.sum())} of them are already in the index (first: {first}); "
            "remove_ids them first, or add with new ids"
        )
