"""Optimisers for every objective (AdamW, SGD and LARS over two parameter groups) and the LR schedules.

Biases and normalisation weights (LayerNorm, BatchNorm, RMSNorm…) get no weight decay (BERT's and
SimCLR's practice: they are offsets and scales, and shrinking them toward 0 only hurts) and, under
LARS, no layer-wise adaptation. Frozen parameters (CLSR's encoder) are left out.

LARS (You et al., 2017), as SimCLR's `lars_optimizer.py` (Chen et al., 2020), whose schedule CLSR
§4.1 adopts: for each parameter w with gradient g,

    g ← g + wd·w                                  (decay group only)
    r = η·‖w‖ / ‖g‖  if ‖w‖ > 0 and ‖g‖ > 0 else 1  (adapted group only; else r = 1)
    v ← μ·v + lr·r·g ;  w ← w − v                 ("classic" momentum: lr inside the velocity)

with η = 0.001 and μ = 0.9 (SimCLR's defaults).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

OPTIMIZERS = ("adamw", "sgd", "lars")
SCHEDULES = ("linear", "cosine", "constant")
#: SGD's and LARS's momentum (SimCLR's, and the value CLSR's SGD runs used)
MOMENTUM = 0.9
#: LARS's trust coefficient η (SimCLR's `eeta`)
LARS_ETA = 1e-3


def no_decay_names(model: nn.Module) -> set[str]:
    """Names (as model.named_parameters() gives them) of biases and normalisation-layer weights."""
    names = set()
    for mod_name, module in model.named_modules():
        # class name, not isinstance: HF models bring their own norms (T5LayerNorm, LlamaRMSNorm…)
        is_norm = isinstance(module, nn.modules.batchnorm._NormBase | nn.LayerNorm | nn.GroupNorm) or (
            "norm" in type(module).__name__.lower()
        )
        for p_name, _ in module.named_parameters(recurse=False):
            if is_norm or p_name == "bias":
                names.add(f"{mod_name}.{p_name}" if mod_name else p_name)
    return names


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """[decayed and adapted, neither] groups of the trainable parameters (shared ones counted once)."""
    skip = no_decay_names(model)
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # deduplicates tied parameters
        if p.requires_grad:
            (no_decay if name in skip else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "lars_adapt": True},
        {"params": no_decay, "weight_decay": 0.0, "lars_adapt": False},
    ]


class LARS(torch.optim.Optimizer):
    """Layer-wise Adaptive Rate Scaling with SimCLR's classic momentum (see the module docstring).

    A group with `lars_adapt=False` is plain SGD with momentum (r = 1), as SimCLR treats biases
    and batch-norm parameters.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float,
        momentum: float = MOMENTUM,
        weight_decay: float = 0.0,
        eta: float = LARS_ETA,
        lars_adapt: bool = True,
    ):
        if lr < 0 or momentum < 0 or weight_decay < 0 or eta <= 0:
            raise ValueError(f"invalid LARS setting: lr={lr} momentum={momentum} wd={weight_decay} eta={eta}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta,
                                      lars_adapt=lars_adapt))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if group["weight_decay"]:
                    g = g.add(p, alpha=group["weight_decay"])
                scaled_lr = torch.as_tensor(group["lr"], dtype=p.dtype, device=p.device)
                if group["lars_adapt"]:
                    w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
                    one = torch.ones_like(w_norm)
                    trust = torch.where((w_norm > 0) & (g_norm > 0), group["eta"] * w_norm / g_norm, one)
                    scaled_lr = scaled_lr * trust
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                v = state["momentum_buffer"]
                v.mul_(group["momentum"]).add_(g * scaled_lr)
                p.sub_(v)
        return loss


def build_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """`name` ("adamw" | "sgd" | "lars") over `model`'s trainable parameters, in param_groups()."""
    groups = param_groups(model, weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(_plain(groups), lr=lr)
    if name == "sgd":
        return torch.optim.SGD(_plain(groups), lr=lr, momentum=MOMENTUM)
    if name == "lars":
        return LARS(groups, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}")


def _plain(groups: list[dict]) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "lars_adapt"} for g in groups]


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: str, warmup: int,
                    total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """`schedule` ("linear" | "cosine" | "constant") over `total` steps after a linear warm-up of `warmup` steps
    that reaches the full rate on step `warmup` (step 0 already trains at 1 / warmup of it, where transformers'
    get_linear_schedule_with_warmup starts at 0)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        if schedule == "linear":
            return max(0.0, 1.0 - progress)
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
