"""The narrow interface between the engine and a model runtime (TEI's `backends/core`).

The engine never touches onnxruntime directly: it asks a backend to run one padded batch of token
ids (in its inference thread). A fake backend with the same interface is what lets the queue, the
engine and the routes be tested without a model; the null backend measures the server without one.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from service.ipc.messages import ModelInfo, TokenBatch
from service.tokenization import TextTokenizer


class Backend(Protocol):
    info: ModelInfo
    pad_to_multiple_of: int  # the engine pads every pass to a multiple of it (1: to the longest row)
    row_buckets: tuple[int, ...]  # a pass's row count is padded up to one of these (none: not padded)
    streams: int  # passes it runs at once, each on its share of the cores (the engine runs a thread per stream)

    @property
    def tokenizer(self) -> TextTokenizer:
        """What makes this backend's token ids from texts (the one `info.tokenizer` names): an engine in the
        caller's own process is served with it (ModelRegistry.add_in_process: tests, tools); the API processes
        load theirs from the export (api/topology.py)."""

    def run(self, batch: TokenBatch, seq_len: int, wide: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """One forward pass over `batch`'s rows padded to `seq_len`: (normalised, raw) float32 [n, dim];
        a cross-encoder's scores as both, [n, 1]. `wide`: on every core, else on one stream's share of them
        (the same bits either way; one stream: no difference)."""

    def run_tokens(self, batch: TokenBatch, seq_len: int,
                   wide: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`run`, and every row's token states too, [n, seq_len, hidden] (TEI's /embed_all); the engine asks only
        a backend whose `info.token_dimension` is not 0, and any other raises BackendError."""

    def warmup(self, max_batch_tokens: int | None = None, max_batch_requests: int | None = None) -> None:
        """Run the first passes before any request; none larger than the queue forms (None: no bound)."""

    def self_check(self) -> None:
        """Before the engine is ready: raise if the model does not give what its export recorded (a backend
        with nothing recorded checks nothing)."""

    def health(self) -> None:
        """Raise if the model cannot run a forward pass."""


class BackendError(RuntimeError):
    """The model failed on a batch (the engine retries its items one by one to find the culprit)."""


def pad_batch(batch: TokenBatch, seq_len: int, pad_id: int, rows: int | None = None) -> dict[str, np.ndarray]:
    """input_ids / attention_mask / token_type_ids as int64 [rows, seq_len]; extra rows are all padding."""
    rows = rows or len(batch)
    mask = np.zeros((rows, seq_len), dtype=np.int64)
    # rows are left-aligned, so the mask's cells in row-major order are the batch's tokens end to end
    real = np.arange(seq_len) < batch.lengths[:, None]
    mask[: len(batch)] = real
    ids = np.full((rows, seq_len), pad_id, dtype=np.int64)
    ids[: len(batch)][real] = batch.ids
    types = np.zeros((rows, seq_len), dtype=np.int64)
    if batch.type_ids is not None:
        types[: len(batch)][real] = batch.type_ids
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
