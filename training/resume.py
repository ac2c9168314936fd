"""What an exact resume needs: the run's state, every RNG, the run's config, atomic writes.

A checkpoint (`checkpoint.pt`, written by the trainer) is a `Checkpoint`: the run's `TrainState` (step,
DataLoader position, what selection has kept), the objective, optimiser, scheduler and GradScaler
states, the config and the RNG states of every rank. On disk it is one flat dict of plain values and
tensors (loaded with weights_only=True, so loading runs no code), in the layout every earlier run wrote.
It is loaded onto the CPU whatever the training device: `torch.set_rng_state` takes only a CPU
ByteTensor, and the states load into modules on any device.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

CHECKPOINT = "checkpoint.pt"
# Fields that say how to run this session, not what is trained: they may differ on resume.
SESSION_FIELDS = frozenset({"resume", "allow_config_change"})


@dataclass
class TrainState:
    """Where a run stands: what changes as it trains, beside the modules' own states. A resume restores it."""

    step: int = 0  # optimiser steps taken
    epoch: int = 0
    batches_in_epoch: int = 0  # batches of `epoch` consumed (the DataLoader position)
    micro: int = 0  # micro-batches in all (gradient accumulation counts them)
    # what selection (training.selection.Selector) has kept as best/, and the base later evaluations must beat
    best_dev: float = -math.inf
    best_step: int = 0
    initial_dev: float = math.nan
    base_items: list[float] | None = None  # the base's per-item dev scores, for the paired bootstrap
    best_rule: str = ""


#: the module states a checkpoint holds beside the TrainState's fields
_MODULE_STATES = ("objective", "optimizer", "scheduler", "scaler")


@dataclass
class Checkpoint:
    """checkpoint.pt: the TrainState, the module states, the config and every rank's RNG states."""

    state: TrainState
    objective: dict[str, Any]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    scaler: dict[str, Any]
    config: dict[str, Any]  # TrainConfig.to_json() of the run
    rng: list[dict[str, Any]] = field(default_factory=list)  # indexed by rank

    def save(self, path: Path) -> None:
        modules = {k: getattr(self, k) for k in _MODULE_STATES}
        save_checkpoint({**modules, **dataclasses.asdict(self.state), "rng": self.rng, "config": self.config}, path)

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        values = load_checkpoint(path)
        if "config" not in values:
            raise ValueError(f"{path} predates exact resume (no config, RNG or data position)")
        state_fields = {f.name for f in dataclasses.fields(TrainState)}
        unknown = sorted(set(values) - state_fields - {*_MODULE_STATES, "rng", "config"})
        if unknown:
            raise ValueError(f"{path} holds {unknown}, which this version does not know: it was written by a "
                             "newer one; resume it with that version")
        # base_items and best_rule came later than the rest: an older checkpoint resumes without them
        state = TrainState(**{k: values[k] for k in state_fields if k in values})
        return cls(state, *(values[k] for k in _MODULE_STATES), config=values["config"], rng=values["rng"])


def atomic_write(path: Path, write) -> None:
    """`write(tmp_path)`, fsync, then rename over `path`: a crash leaves the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path) -> dict[str, Any]:
    # weights_only: tensors and plain containers only, so a checkpoint cannot run code when it loads
    return torch.load(path, map_location="cpu", weights_only=True)


def rng_state() -> dict[str, Any]:
    """Every RNG's state as tensors, lists and numbers (what a weights_only load accepts)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy": (kind, keys.tolist(), pos, has_gauss, cached),
        "python": random.getstate(),
    }


def all_rng_states() -> list[dict[str, Any]]:
    """This process's RNG states, or every rank's (indexed by rank) under torch.distributed."""
    mine = rng_state()
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return [mine]
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, mine)
    return states


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'field: old → new' for each setting (objective keywords as objective.<name>) that differs."""

    def flat(cfg: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in cfg.items() if k != "objective" and k not in SESSION_FIELDS}
        out.update({f"objective.{k}": v for k, v in (cfg.get("objective") or {}).items()})
        return out

    old, new = flat(saved), flat(current)
    missing = object()
    return [f"{k}: {old.get(k, '(unset)')!r} → {new.get(k, '(unset)')!r}"
            for k in sorted(old.keys() | new.keys()) if old.get(k, missing) != new.get(k, missing)]


def config_from_json(cls, values: dict[str, Any]):
    """A config dataclass back from its `to_json()`: fields typed Path get Paths again."""
    paths = {f.name for f in dataclasses.fields(cls) if "Path" in str(f.type)}
    return cls(**{k: Path(v) if k in paths and v is not None else v for k, v in values.items()})


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the rows a crashed run logged after its last checkpoint: the resumed run redoes those steps."""
    if not path.is_file():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in rows if json.loads(line).get("step", 0) <= step]
    if len(kept) != len(rows):
        atomic_write(path, lambda tmp: tmp.write_text("".join(line + "\n" for line in kept)))
