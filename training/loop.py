"""The optimisation loop, one for every stage of training (training/objectives/base.py's `Stage`).

For each micro-batch: move it to the device, run the stage's loss under autocast through
`training.distributed.replicate` (DDP on several processes: it averages the gradients, and
`no_sync` holds that back until a step's last micro-batch), and back-propagate it, scaled by fp16's
GradScaler where the stage has one, or with GradCache where the stage asks. After a step's last
micro-batch: clip the gradient norm, step the optimiser and the LR schedule, and hand the step to
`after_step`, which can stop the stage (the trainer evaluates, checkpoints and logs there).

The run's own stage and an objective's earlier ones (InfoCSE's stage 1) differ only in what their
Stage holds; `run_stages` runs an objective's earlier ones, as the trainer does before its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from tqdm.auto import tqdm

from training.distributed import rank, replicate
from training.gradcache import cached_step
from training.objectives.base import Objective, Stage
from training.resume import TrainState

#: after_step(step, outputs of the step's last micro-batch) -> True to end the stage there
AfterStep = Callable[[int, dict[str, torch.Tensor]], bool]


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    def move(v):
        if isinstance(v, torch.Tensor):
            return v.to(device, non_blocking=True)
        if isinstance(v, dict):
            return {k: x.to(device, non_blocking=True) if isinstance(x, torch.Tensor) else x for k, x in v.items()}
        return v

    return {k: move(v) for k, v in batch.items()}


def run_stage(objective: Objective, stage: Stage, device: torch.device, state: TrainState | None = None,
              after_step: AfterStep | None = None) -> TrainState:
    """Train `stage` from `state` (its step and micro-batch counters; a fresh one by default) until
    `stage.steps` or until `after_step` says stop; returns the state, counted on."""
    state = state if state is not None else TrainState()
    model = replicate(objective, device)
    scaler = stage.scaler or torch.amp.GradScaler(device.type, enabled=False)
    batches = iter(stage.batches)
    bar = tqdm(total=stage.steps, initial=state.step, disable=rank() != 0, desc=stage.name, dynamic_ncols=True)
    was_training = objective.training
    objective.train()
    stage.optimizer.zero_grad(set_to_none=True)
    try:
        while state.step < stage.steps:
            sync = (state.micro + 1) % stage.micro_batches == 0
            out = _forward_backward(objective, model, stage, to_device(next(batches), device), sync, scaler,
                                    device)
            state.micro += 1
            if not sync:
                continue
            if stage.max_grad_norm:
                scaler.unscale_(stage.optimizer)
                torch.nn.utils.clip_grad_norm_(stage.params, stage.max_grad_norm)
            scaler.step(stage.optimizer)
            scaler.update()
            stage.optimizer.zero_grad(set_to_none=True)
            stage.scheduler.step()
            state.step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{float(out['loss'].detach()):.3g}")
            if after_step is not None and after_step(state.step, out):
                break
    finally:
        bar.close()
        close = getattr(batches, "close", None)
        if close is not None:  # a generator's DataLoader iterator, with any worker processes
            close()
        objective.train(was_training)
    return state


def _forward_backward(objective: Objective, model: torch.nn.Module, stage: Stage, batch: dict[str, Any], sync: bool,
                      scaler: torch.amp.GradScaler, device: torch.device) -> dict[str, torch.Tensor]:
    """One micro-batch's forward and backward; DDP averages the gradients after it when `sync`."""
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)  # DDP's, or nothing to hold back
    autocast = torch.autocast(device.type, dtype=stage.autocast, enabled=stage.autocast is not None)
    if stage.grad_cache:
        with autocast:
            return cached_step(objective, batch, stage.grad_cache, lambda x: scaler.scale(x).backward(),
                               forward=model, no_sync=no_sync, sync=sync)
    with contextlib.nullcontext() if sync else no_sync(), autocast:
        out = model(stage.loss or objective, batch)
        loss = out["loss"] / stage.micro_batches
    scaler.scale(loss).backward()
    return out


def run_stages(objective: Objective, examples: list, device: torch.device) -> None:
    """The stages an objective declares before the run's own (Objective.stages), each trained in turn."""
    for stage in objective.stages(examples, device):
        run_stage(objective, stage, device)
