"""The contract between the training loop and an objective.

The loop only ever does: `batch = objective.collate(examples)`, `out = objective(batch)`,
`out["loss"].backward()`, and at the end exports `objective.inference_encoder()`. An objective that
trains in phases (InfoCSE's stage 1) declares the ones before that as `Stage`s from `stages()`, and
the same loop runs each. Everything particular to a paper (heads, augmentation, auxiliary networks,
caches) lives in its objective, and its hyper-parameters in a settings dataclass beside it (the
paper's defaults), which TrainConfig holds.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

import torch
from torch import nn

from core.encoder import SentenceEncoder


@dataclasses.dataclass(frozen=True)
class ObjectiveSettings:
    """Base of each objective's settings: built from a preset's or the command line's key=values."""

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Self:
        """The paper's defaults with `values` over them; unknown keys and values of the wrong type are refused."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown {cls.__name__} setting(s) {unknown}; known: {', '.join(known)}")
        return cls(**values)

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not _has_type(value, hints[f.name]):
                raise ValueError(f"{type(self).__name__}.{f.name} must be {_type_name(hints[f.name])}, got {value!r}")


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(h) for h in typing.get_args(hint))
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _has_type(value: Any, hint: Any) -> bool:
    """isinstance for the field types settings use: scalars, Path, None and unions of them."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_has_type(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:  # an int is a float here, as in Python's own numeric tower; a bool is not
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is Path:  # a path from the command line is a string
        return isinstance(value, str | Path)
    return isinstance(value, hint)


@dataclasses.dataclass
class Stage:
    """One phase of training as the loop (training/loop.py) runs it: micro-batches from `batches`, `micro_batches`
    of them to an optimiser step, for `steps` steps. The run's own stage is the objective's forward under
    TrainConfig's settings; an objective declares the phases before it (Objective.stages) with their own."""

    name: str
    batches: Iterable[dict[str, Any]]  # collated micro-batches (CPU tensors), at least steps × micro_batches
    steps: int
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    #: a micro-batch's loss under "loss" (the loop averages a step's micro-batches), plus anything worth logging;
    #: None: the objective's forward
    loss: Callable[[dict[str, Any]], dict[str, torch.Tensor]] | None = None
    micro_batches: int = 1
    max_grad_norm: float | None = None  # clips the norm of `params`' gradients
    params: list[nn.Parameter] = dataclasses.field(default_factory=list)
    autocast: torch.dtype | None = None  # mixed precision's dtype; None: full precision
    scaler: torch.amp.GradScaler | None = None  # fp16's loss scaling; None: none
    grad_cache: int | None = None  # GradCache's mini-batch (training/gradcache.py); None: off


class Objective(nn.Module):
    name: ClassVar[str]
    #: the dataclass of its hyper-parameters (the paper's defaults), beside the objective in its module
    settings_type: ClassVar[type[ObjectiveSettings]]
    #: which examples `collate` takes: "unlabeled" (str), "pairs" (PairExample), "scored" (ScoredPair)
    data_kind: ClassVar[str]
    #: a training.sampling.SAMPLERS name, or None for a plain shuffle (CoSENT needs mixed labels)
    batch_sampler: ClassVar[str | None] = None
    #: the loss compares the examples of a batch with each other (in-batch negatives, ranking), so
    #: gradient accumulation over micro-batches would silently shrink it (training/config.py refuses)
    in_batch: ClassVar[bool] = True
    #: GradCache support (training/gradcache.py): how collate stacks the N examples per key, and
    #: `embed` / `loss_from_embedded` methods; None: not supported
    row_groups: ClassVar[dict[str, int] | None] = None

    def __init__(self, encoder: SentenceEncoder, settings: ObjectiveSettings):
        super().__init__()
        self.encoder = encoder
        self.settings = settings

    def prepare(self, examples: list, device: torch.device) -> None:
        """Once before training (and before stages()), with every training example (CLSR caches frozen
        embeddings here). On resume it runs after load_checkpoint_state_dict()."""

    def stages(self, examples: list, device: torch.device) -> Iterator[Stage]:
        """The phases this objective trains before the run's own, each run by the loop before the next is asked
        for (so code after a `yield` sees the stage trained). After prepare(), and after
        load_checkpoint_state_dict() on resume, so that a stage the state already holds is not run again.
        Default: none."""
        return iter(())

    def collate(self, examples: list) -> dict[str, Any]:
        """Raw examples of `data_kind` → a batch of CPU tensors (runs in DataLoader workers)."""
        raise NotImplementedError

    def forward(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The batch's loss under "loss", plus any components worth logging (detached floats are fine)."""
        raise NotImplementedError

    def checkpoint_state_dict(self) -> dict[str, Any]:
        """What a training checkpoint keeps of this objective: by default everything."""
        return self.state_dict()

    def load_checkpoint_state_dict(self, state: dict[str, Any]) -> None:
        """The inverse of checkpoint_state_dict(), on an objective built from the same config."""
        self.load_state_dict(state)

    def inference_encoder(self) -> SentenceEncoder:
        """The model that gets evaluated and exported: training-only heads are not part of it."""
        return self.encoder
