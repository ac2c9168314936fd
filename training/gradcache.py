"""GradCache (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited
Setup"; sentence-transformers' CachedMultipleNegativesRankingLoss): a large in-batch loss on a small
device, with the gradient of the full batch.

    1. embed the batch mini-batch by mini-batch without a graph, saving the RNG state before each;
    2. the full batch's loss on those embeddings (the objective's heads get their gradient here),
       back-propagated to the embeddings only;
    3. re-embed each mini-batch with a graph under its saved RNG state (the same dropout masks, so
       the same embeddings) and back-propagate the cached embedding gradient into the encoder.

Peak activation memory is one mini-batch through the encoder; the cost is a second forward.

An objective supports it by declaring `row_groups` (how `collate` stacks the N examples: key →
number of N-row groups, e.g. SimCSE's [x; x] is 2), `embed(batch)` (rows stacked in
`embed_groups` groups of N) and `loss_from_embedded(emb, batch)`, with forward(batch) =
loss_from_embedded(embed(batch), batch).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch


def num_examples(batch: dict[str, Any], row_groups: dict[str, int]) -> int:
    key, groups = next(iter(row_groups.items()))
    value = batch[key]
    first = next(iter(value.values())) if isinstance(value, dict) else value
    return first.shape[0] // groups


def take_rows(batch: dict[str, Any], row_groups: dict[str, int], start: int, stop: int) -> dict[str, Any]:
    """Examples start..stop of a collated batch (the same rows of every group)."""
    n = num_examples(batch, row_groups)

    def cut(t: torch.Tensor, groups: int) -> torch.Tensor:
        return torch.cat([t[g * n + start : g * n + stop] for g in range(groups)])

    return {
        key: {k: cut(t, groups) for k, t in batch[key].items()} if isinstance(batch[key], dict)
        else cut(batch[key], groups)
        for key, groups in row_groups.items()
    }


def _regroup(parts: list[torch.Tensor], groups: int) -> torch.Tensor:
    """Mini-batch embeddings [g0; g1] each → the full batch's [g0 of all; g1 of all]."""
    split = [p.chunk(groups) for p in parts]
    return torch.cat([piece[g] for g in range(groups) for piece in split])


def _ungroup(full: torch.Tensor, sizes: list[int], groups: int) -> list[torch.Tensor]:
    """The inverse of _regroup: the full batch's rows → each mini-batch's [g0; g1]."""
    per_group = [g.split(sizes) for g in full.chunk(groups)]
    return [torch.cat([per_group[g][i] for g in range(groups)]) for i in range(len(sizes))]


def _rng_state(device: torch.device):
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


@contextlib.contextmanager
def _replay(state, device: torch.device):
    """Run the block from a saved RNG state, leaving the global RNG as it was after step 1."""
    after = _rng_state(device)
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
    try:
        yield
    finally:
        torch.set_rng_state(after[0])
        if after[1] is not None:
            torch.cuda.set_rng_state(after[1], device)


def supports(objective) -> bool:
    return getattr(objective, "row_groups", None) is not None


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def cached_step(
    objective,
    batch: dict[str, Any],
    micro_batch: int,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    forward: Callable[..., Any] = _call,
    no_sync: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    sync: bool = True,
) -> dict[str, torch.Tensor]:
    """One training step's forward and backward with GradCache; returns the objective's outputs.

    `backward(loss)` runs the loss's backward (the loop passes its GradScaler's scaled backward);
    the embedding gradients it caches are already scaled, so the encoder's are too. `forward(fn, *args)`
    runs each pass that builds a graph (the loop's training.distributed.Calls, under DDP on several
    processes) and `no_sync()` keeps DDP from averaging after it: every pass runs under it but the
    last, and that one too unless `sync` (a micro-batch of a step that accumulates more).
    """
    if not supports(objective):
        raise ValueError(f"{type(objective).__name__} does not support GradCache (no row_groups/embed)")
    n = num_examples(batch, objective.row_groups)
    bounds = [(s, min(s + micro_batch, n)) for s in range(0, n, micro_batch)]
    groups = objective.embed_groups
    device = next(objective.parameters()).device
    states, parts = [], []
    with torch.no_grad():
        for start, stop in bounds:
            states.append(_rng_state(device))
            parts.append(objective.embed(take_rows(batch, objective.row_groups, start, stop)))
    emb = _regroup(parts, groups).detach().requires_grad_()
    with no_sync():
        out = forward(objective.loss_from_embedded, emb, batch)
    backward(out["loss"])
    grads = _ungroup(emb.grad, [stop - start for start, stop in bounds], groups)
    for i, ((start, stop), state, grad) in enumerate(zip(bounds, states, grads)):
        last = sync and i == len(bounds) - 1
        with contextlib.nullcontext() if last else no_sync(), _replay(state, device):
            forward(objective.embed, take_rows(batch, objective.row_groups, start, stop)).backward(grad)
    return out
