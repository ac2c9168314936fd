"""Losses more than one objective computes, written once (objectives import them from here, not from each other).

Each works on embeddings already computed, so GradCache (training/gradcache.py) and every objective call it the
same way, and each keeps the DDP contract of training/distributed.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from training.distributed import gather_with_grad, is_distributed


def info_nce(queries: torch.Tensor, keys: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over local rows i of −log softmax_j(cos(q_i, k_j)/τ)[i], keys gathered over GPUs.

    queries, keys: [B, d] on this rank, row i of each is a positive pair. Keys from every rank are
    the candidates, so this rank's positives sit at rank·B + i (identity on one process). The
    gather keeps every rank's gradient into this rank's keys, so DDP's average is the global
    batch's gradient.
    """
    all_keys = gather_with_grad(keys)
    dtype = torch.float32 if queries.dtype in (torch.float16, torch.bfloat16) else queries.dtype
    sim = F.normalize(queries.to(dtype), dim=-1) @ F.normalize(all_keys.to(dtype), dim=-1).T / temperature
    offset = dist.get_rank() * queries.shape[0] if is_distributed() else 0
    labels = torch.arange(queries.shape[0], device=sim.device) + offset
    return F.cross_entropy(sim, labels)
