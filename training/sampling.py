"""Batch samplers an objective can ask for through its `batch_sampler` class attribute.

`Objective.batch_sampler` names one of SAMPLERS, or is None (the default: a plain shuffle, the
loop's own DataLoader(shuffle=True)). The loop builds it with `make_batch_sampler(...)` and passes it
as DataLoader(batch_sampler=...). Objectives that rank pairs against each other (CoSENT) learn
nothing from a batch whose labels are all equal, so they may ask for "mixed_labels".
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler


class MixedLabelBatchSampler(Sampler[list[int]]):
    """Stratified batches: each batch gets a share of every label value, in proportion.

    Each epoch: shuffle, stable-sort by label (so items of equal label stay in random order), then
    deal the sorted list round-robin over the batches (item p → batch p mod n_batches). Every batch
    thus spans the label range, like a stratified sample (for continuous scores: quantile strata).
    A batch that still holds one label value (only possible when the other labels are scarce) swaps
    an item with a batch that can spare a different label; if the whole dataset has too few
    off-label items for that, `oversample=True` appends one random off-label item (a duplicate) to
    each remaining single-label batch, otherwise it is left as is. Batch order and the order inside
    each batch are shuffled. Every item appears exactly once per epoch apart from those duplicates
    (and, with drop_last, a random N mod batch_size items left out that epoch).

    Distributed: give every rank the same seed and its num_replicas / rank; all ranks draw the same
    global batch list and rank r takes batches r, r + R, ... (truncated to equal counts). Call
    `set_epoch(epoch)` before each epoch, as with torch's DistributedSampler. In-batch losses gather
    equal shapes from every rank, so with num_replicas > 1 every batch holds exactly batch_size
    items: drop_last is implied and oversampling swaps the off-label item in for one of the batch's
    own instead of appending it.
    """

    def __init__(
        self,
        labels: Sequence[float],
        batch_size: int,
        drop_last: bool = False,
        seed: int = 0,
        oversample: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
    ):
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.labels = np.asarray(labels, dtype=np.float64)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.seed = seed
        self.oversample = oversample
        self.num_replicas = num_replicas
        self.rank = rank
        self.equal_sizes = num_replicas > 1
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _num_global_batches(self) -> int:
        n = len(self.labels)
        return n // self.batch_size if self.drop_last or self.equal_sizes else math.ceil(n / self.batch_size)

    def __len__(self) -> int:
        return self._num_global_batches() // self.num_replicas

    def global_batches(self) -> list[list[int]]:
        """This epoch's batches for all ranks together."""
        rng = np.random.default_rng((self.seed, self.epoch))
        n_batches = self._num_global_batches()
        if n_batches == 0:
            return []
        order = rng.permutation(len(self.labels))
        if self.drop_last or self.equal_sizes:
            order = order[: n_batches * self.batch_size]
        order = order[np.argsort(self.labels[order], kind="stable")]
        batches = [order[b::n_batches].tolist() for b in range(n_batches)]
        self._mix(batches, rng)
        for batch in batches:
            rng.shuffle(batch)
        return [batches[i] for i in rng.permutation(n_batches)]

    def _mix(self, batches: list[list[int]], rng: np.random.Generator) -> None:
        """Repair single-label batches in place (swap first, then optionally a duplicate)."""
        labels = self.labels
        if self.batch_size < 2 or len(np.unique(labels)) < 2:
            return  # nothing to mix
        for b, batch in enumerate(batches):
            own = labels[batch[0]]
            if np.any(labels[batch] != own):
                continue
            if len(batch) >= 2 and self._swap_in(b, own, batches, rng):
                continue
            if self.oversample:
                candidates = np.flatnonzero(labels != own)
                pick = int(candidates[rng.integers(len(candidates))])
                if self.equal_sizes and len(batch) >= 2:
                    batch[-1] = pick
                else:
                    batch.append(pick)

    def _swap_in(self, b: int, own: float, batches: list[list[int]], rng: np.random.Generator) -> bool:
        """Trade batch b's first item for an off-label item of a donor batch that stays mixed.

        A donor keeps being mixed after giving one non-`own` item away and taking an `own` one iff
        it has at least two items whose label differs from `own`.
        """
        labels = self.labels
        for d in rng.permutation(len(batches)):
            off = [j for j, i in enumerate(batches[d]) if labels[i] != own]
            if d != b and len(off) >= 2:
                j = off[rng.integers(len(off))]
                batches[b][0], batches[d][j] = batches[d][j], batches[b][0]
                return True
        return False

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.global_batches()
        per_rank = len(batches) // self.num_replicas
        yield from batches[self.rank :: self.num_replicas][:per_rank]


SAMPLERS = {"mixed_labels": MixedLabelBatchSampler}


def example_label(example) -> float:
    """The label a sampler stratifies on (ScoredPair.label)."""
    return float(example.label)


def make_batch_sampler(
    name: str | None,
    examples: Sequence,
    batch_size: int,
    *,
    drop_last: bool = False,
    seed: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
) -> Sampler[list[int]] | None:
    """The sampler `Objective.batch_sampler` names, or None for the loop's plain shuffle."""
    if name is None:
        return None
    if name not in SAMPLERS:
        raise ValueError(f"unknown batch sampler {name!r}; choose from {', '.join(SAMPLERS)} or None")
    return SAMPLERS[name](
        [example_label(e) for e in examples],
        batch_size,
        drop_last=drop_last,
        seed=seed,
        num_replicas=num_replicas,
        rank=rank,
    )
