"""The narrow interface between the engine and a model runtime (TEI's `backends/core`).

The engine never touches onnxruntime directly: it asks a backend to run one padded batch of token
ids (in its inference thread). A fake backend with the same interface is what lets the queue, the
engine and the routes be tested without a model; the null backend measures the server without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from service.ipc.messages import ModelInfo, TokenBatch


@dataclass(slots=True)
class Tokenized:
    """One input of a pass: its token ids (a view into the request's TokenBatch)."""

    ids: np.ndarray | list[int]
    type_ids: np.ndarray | list[int] | None = None

    @property
    def length(self) -> int:
        return len(self.ids)


def tokenized_rows(batch: TokenBatch) -> list[Tokenized]:
    """A TokenBatch's inputs as the backend takes them (views into its buffers)."""
    return [Tokenized(batch.row(i), batch.type_row(i)) for i in range(len(batch))]


class Backend(Protocol):
    info: ModelInfo
    pad_to_multiple_of: int  # the engine pads every pass to a multiple of it (1: to the longest row)
    row_buckets: tuple[int, ...]  # a pass's row count is padded up to one of these (none: not padded)

    def run(self, items: list[Tokenized], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """One forward pass over `items` padded to `seq_len`: (normalised, raw) float32 [n, dim];
        a cross-encoder's scores as both, [n, 1]."""

    def warmup(self, max_batch_tokens: int | None = None, max_batch_requests: int | None = None) -> None:
        """Run the first passes before any request; none larger than the queue forms (None: no bound)."""

    def health(self) -> None:
        """Raise if the model cannot run a forward pass."""


class BackendError(RuntimeError):
    """The model failed on a batch (the engine retries its items one by one to find the culprit)."""


def pad_batch(items: list[Tokenized], seq_len: int, pad_id: int, rows: int | None = None) -> dict[str, np.ndarray]:
    """input_ids / attention_mask / token_type_ids as int64 [rows, seq_len]; extra rows are all padding."""
    rows = rows or len(items)
    ids = np.full((rows, seq_len), pad_id, dtype=np.int64)
    mask = np.zeros((rows, seq_len), dtype=np.int64)
    types = np.zeros((rows, seq_len), dtype=np.int64)
    for row, item in enumerate(items):
        n = len(item.ids)
        ids[row, :n] = item.ids
        mask[row, :n] = 1
        if item.type_ids is not None:
            types[row, :n] = item.type_ids
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def bucketed_rows(rows: int, buckets: tuple[int, ...]) -> int:
    """The row count a pass of `rows` inputs runs with: the smallest bucket that holds them, past the last
    a multiple of it; `rows` itself without buckets."""
    for bucket in buckets:
        if rows <= bucket:
            return bucket
    return -(-rows // buckets[-1]) * buckets[-1] if buckets else rows


def padded_length(longest: int, multiple: int) -> int:
    """The sequence length a batch whose longest item has `longest` tokens is padded to."""
    return -(-longest // multiple) * multiple
