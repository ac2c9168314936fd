"""Training on several processes: the process group, DDP around the objective, and in-batch
negatives gathered from every rank with their gradient paths.

The contract every objective keeps under DDP: rank r's loss is its share of the global batch's
loss (mean over its own queries, candidates from all ranks), so that DDP's gradient average gives
exactly the gradient of one process on the global batch (tests/test_distributed.py checks this).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def set_up() -> tuple[int, int, torch.device]:
    """(rank, world size, device): joins torchrun's process group (WORLD_SIZE > 1) unless one exists already."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return rank(), world_size(), torch.device("cuda", local)
    return rank(), world_size(), torch.device("cpu")


class Calls(nn.Module):
    """Runs a function of `module` as this module's forward. DDP averages the gradients of what its forward
    computed; through this one wrapper, every pass a step makes (a stage's loss, GradCache's loss on cached
    embeddings and its embedding passes) is such a forward."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


def replicate(module: nn.Module, device: torch.device) -> nn.Module:
    """Calls(module), under DistributedDataParallel when several processes train (which starts every rank
    from rank 0's parameters and buffers). Built per stage: DDP covers the parameters trainable when built."""
    calls = Calls(module)
    if not is_distributed():
        return calls
    return nn.parallel.DistributedDataParallel(calls, device_ids=[device.index] if device.type == "cuda" else None,
                                               find_unused_parameters=True)


def _check_equal_rows(t: torch.Tensor) -> None:
    # Unequal shapes would hang or crash inside all_gather; every rank sees the same sizes, so all
    # of them raise together instead.
    rows = torch.tensor([t.shape[0]], device=t.device)
    sizes = [torch.zeros_like(rows) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, rows)
    sizes = [int(s) for s in sizes]
    if len(set(sizes)) > 1:
        raise ValueError(f"ranks hold batches of {sizes} rows: in-batch objectives need equal per-rank batch "
                         "sizes (a DistributedSampler, or a batch sampler that pads/drops to equal sizes)")


def gather_with_grad(t: torch.Tensor) -> torch.Tensor:
    """Concatenate `t` from all ranks along dim 0 (rank order); identity on one process.

    Autograd-aware (torch.distributed.nn): the backward sums, over all ranks, the gradient each
    rank's loss sends to these rows and hands it to the rank that owns them. A plain all_gather with
    only the local slot live would drop the gradient of being another rank's negative (about half
    the key gradient at 2 ranks).
    """
    if not is_distributed():
        return t
    _check_equal_rows(t)
    return torch.cat(dist_nn.all_gather(t.contiguous()), dim=0)


def local_slice(t: torch.Tensor, rows: int) -> torch.Tensor:
    """This rank's `rows` rows of a tensor gathered with gather_with_grad."""
    return t[rank() * rows : (rank() + 1) * rows]


def global_share(count: int, device: torch.device) -> float:
    """count · world / Σ_ranks count: turns this rank's mean over `count` items into its share of
    the global mean (DDP averages the ranks), for losses whose item count varies by rank (masked
    tokens). 1 on one process."""
    if not is_distributed():
        return 1.0
    total = torch.tensor([float(count)], dtype=torch.float64 if device.type == "cpu" else torch.float32,
                         device=device)
    dist.all_reduce(total)
    return float(count) * dist.get_world_size() / max(float(total), 1.0)
