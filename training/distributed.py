"""In-batch negatives across GPUs: gather embeddings from every rank, keeping this rank's gradient."""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather_with_grad(t: torch.Tensor) -> torch.Tensor:
    """Concatenate `t` from all ranks along dim 0; identity on one process.

    all_gather returns tensors without grad, so this rank's slot is put back as the live tensor:
    each rank back-propagates through its own rows, as SimCSE's distributed training does.
    """
    if not is_distributed():
        return t
    parts = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    parts[dist.get_rank()] = t
    return torch.cat(parts, dim=0)
