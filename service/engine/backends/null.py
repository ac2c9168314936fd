"""The null backend: the export's real dimension and limits, no model compute.

With it (SEMBED_BACKEND=null) a benchmark measures what the server itself costs, HTTP, JSON,
tokenisation, IPC and batching, on any machine: every pass answers the same unit vector per row,
in the shapes and dtypes the real model gives.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from service.engine.backends.base import BackendError
from service.ipc.messages import ModelInfo, TokenBatch
from service.manifest import Manifest
from service.tokenization import Tokenizer


class NullBackend:
    def __init__(self, export_dir: str | Path, pad_to_multiple_of: int = 8):
        self.export_dir = Path(export_dir)
        manifest = Manifest.load(self.export_dir)
        dimension = manifest.dimension
        self.info = ModelInfo(model=manifest.name, dimension=dimension, max_seq_length=manifest.max_seq_length,
                              device="cpu", manifest=manifest.model_dump(mode="json"), kind=manifest.kind,
                              graph_sha256=f"null:{manifest.onnx_sha256}")
        self.pad_to_multiple_of = pad_to_multiple_of
        self.row_buckets: tuple[int, ...] = ()
        self.streams = 1
        self._unit = np.full(dimension, dimension ** -0.5, dtype=np.float32)

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """The export's, as the API processes load it; read when first asked for (an engine process never asks)."""
        return Tokenizer(self.export_dir)

    def run(self, batch: TokenBatch, seq_len: int, wide: bool = True) -> tuple[np.ndarray, np.ndarray]:
        vectors = np.broadcast_to(self._unit, (len(batch), len(self._unit)))
        return vectors, vectors

    def run_tokens(self, batch: TokenBatch, seq_len: int,
                   wide: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise BackendError("the null backend gives no token states (its info.token_dimension is 0)")

    def self_check(self) -> None:
        pass  # no recorded vectors to compare with

    def warmup(self, max_batch_tokens: int | None = None, max_batch_requests: int | None = None) -> None:
        pass

    def health(self) -> None:
        pass
