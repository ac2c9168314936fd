"""The contract between the training loop and an objective.

The loop only ever does: `batch = objective.collate(examples)`, `out = objective(batch)`,
`out["loss"].backward()`, and at the end exports `objective.inference_encoder()`. Everything
particular to a paper (heads, augmentation, auxiliary networks, caches) lives in its objective.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from core.encoder import SentenceEncoder


class Objective(nn.Module):
    name: ClassVar[str]
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

    def __init__(self, encoder: SentenceEncoder):
        super().__init__()
        self.encoder = encoder

    def prepare(self, examples: list, device: torch.device) -> None:
        """Once before training, with every training example (CLSR caches frozen embeddings here).

        On resume it runs after load_checkpoint_state_dict(): what that state holds
        (InfoCSE's stage-1 result) need not be computed again."""

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
