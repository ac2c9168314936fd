"""The narrow interface between the engine and a model runtime (TEI's `backends/core`).

The engine never touches onnxruntime or a tokenizer directly: it asks a backend to tokenize texts
(in its worker pool) and to run one padded batch (in its inference thread). A fake backend with the
same interface is what lets the queue, the engine and the routes be tested without a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from service.manifest import CROSS_ENCODER, EMBEDDING


@dataclass(slots=True)
class Tokenized:
    """One text after tokenisation: what the queue schedules and the backend runs."""

    ids: list[int]
    type_ids: list[int] | None
    original_tokens: int  # tokens before truncation, specials included

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def truncated(self) -> bool:
        return self.original_tokens > len(self.ids)


@dataclass(frozen=True)
class BackendInfo:
    model: str  # the export's name, what the API reports as `model`
    dimension: int
    max_seq_length: int
    device: str  # "cpu" | "cuda"
    variant: str = "fp32"  # which graph of the export: fp32, int8, fp16
    manifest: dict[str, Any] = field(default_factory=dict)
    vocab_size: int | None = None  # token ids a client sends must be below it
    graph_sha256: str = ""  # of the graph that makes the vectors: what stamps a collection of them
    kind: str = EMBEDDING  # or CROSS_ENCODER: `run` gives one score per row, as a [n, 1] "vector"

    @property
    def is_cross_encoder(self) -> bool:
        return self.kind == CROSS_ENCODER


class Backend(Protocol):
    info: BackendInfo
    pad_to_multiple_of: int  # the engine pads every pass to a multiple of it (1: to the longest row)

    def tokenize(self, texts: list[str], truncation_direction: str = "right") -> list[Tokenized]:
        """Truncated to info.max_seq_length, cutting the end (right) or the start (left);
        `original_tokens` keeps the untruncated count."""

    def tokenize_pairs(self, query: str, texts: list[str], truncation_direction: str = "right") -> list[Tokenized]:
        """(query, text) pairs as one sequence each, for a cross-encoder; too long: the longer side is cut."""

    def token_details(self, texts: list[str], add_special_tokens: bool = True) -> list[list[dict[str, Any]]]:
        """TEI's /tokenize answer: per text, each token's id, text, special flag and character span."""

    def run(self, items: list[Tokenized], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """One forward pass over `items` padded to `seq_len`: (normalised, raw) float32 [n, dim];
        a cross-encoder's scores as both, [n, 1]."""

    def warmup(self) -> None: ...

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


def padded_length(longest: int, multiple: int) -> int:
    """The sequence length a batch whose longest item has `longest` tokens is padded to."""
    return -(-longest // multiple) * multiple
