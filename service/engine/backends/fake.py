"""A model-free backend for tests of the queue, the engine and the routes (Infinity's dummy model).

It takes the ids of service.tokenization.WordTokenizer (words are tokens). A row's vector depends
only on its own token ids, never on the batch, so a test can tell exactly which rows went where.
The word FAIL makes any batch holding it raise, as a real runtime does on an input it cannot
handle; `gate` holds passes back so a test can fill the queue. As a cross-encoder
(`kind="cross-encoder"`) a pair's score is the number of distinct words its two sides share, minus
one: a test knows the ranking /rerank must give.
"""

from __future__ import annotations

import hashlib
import threading
import time
import zlib

import numpy as np

from service.engine.backends.base import BackendError, bucketed_rows
from service.ipc.messages import ModelInfo, TokenBatch
from service.manifest import CROSS_ENCODER, EMBEDDING
from service.tokenization import WordTokenizer

CLS, SEP, FAIL = WordTokenizer.CLS, WordTokenizer.SEP, WordTokenizer.FAIL


class FakeBackend:
    def __init__(self, name: str = "fake", dimension: int = 8, max_seq_length: int = 32,
                 pad_to_multiple_of: int = 16, seconds_per_token: float = 0.0, kind: str = EMBEDDING,
                 row_buckets: tuple[int, ...] = (), streams: int = 1):
        if kind == CROSS_ENCODER:
            dimension = 1  # the score
        self.info = ModelInfo(model=name, dimension=dimension, max_seq_length=max_seq_length, device="cpu",
                              manifest={"name": name, "dimension": dimension, "max_seq_length": max_seq_length,
                                        "kind": kind},
                              vocab_size=31000, kind=kind, tokenizer="words",
                              graph_sha256=hashlib.sha256(f"fake:{name}:{dimension}".encode()).hexdigest())
        self.pad_to_multiple_of = pad_to_multiple_of
        self.row_buckets = row_buckets  # as a CUDA backend pads its passes' row counts
        self.streams = streams
        self.seconds_per_token = seconds_per_token
        self.tokenizer = WordTokenizer(max_seq_length)
        self.gate = threading.Event()
        self.gate.set()
        self.at_gate = threading.Event()  # a pass has reached the gate (and waits there while it is closed)
        self.passes: list[list[int]] = []  # the unpadded lengths of each forward pass's rows
        self.wide: list[bool] = []  # each pass's `wide`
        self.running = self.most_running = 0  # passes in `run` now, and the most at once
        self._count = threading.Lock()
        self.padded_tokens: list[int] = []  # rows (bucketed) × seq_len of each pass
        self.healthy = True

    def tokenize(self, texts: list[str]) -> TokenBatch:
        """Texts as the engine receives them (tests)."""
        return self.tokenizer.encode(texts)[0]

    def run(self, batch: TokenBatch, seq_len: int, wide: bool = True) -> tuple[np.ndarray, np.ndarray]:
        with self._count:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            self.at_gate.set()
            self.gate.wait()
            lengths = batch.lengths.tolist()
            assert max(lengths) <= seq_len, "a row longer than its batch"
            self.passes.append(lengths)
            self.wide.append(wide)
            padded = bucketed_rows(len(batch), self.row_buckets) * seq_len
            self.padded_tokens.append(padded)
            if self.seconds_per_token:
                time.sleep(self.seconds_per_token * padded)
        finally:
            with self._count:
                self.running -= 1
        if FAIL in batch.ids:
            raise BackendError("fake backend: the batch holds FAIL")
        if self.info.is_cross_encoder:
            scores = np.array([[self._score(batch.row(i), batch.type_row(i))] for i in range(len(batch))],
                              dtype=np.float32)
            return scores, scores
        raw = np.stack([self._vector(batch.row(i)) for i in range(len(batch))])
        return raw / np.linalg.norm(raw, axis=1, keepdims=True), raw

    @staticmethod
    def _score(ids_row: np.ndarray, type_row: np.ndarray | None) -> float:
        ids = [int(t) for t in ids_row]
        types = [int(t) for t in type_row] if type_row is not None else [0] * len(ids)
        first = {t for t, s in zip(ids, types) if s == 0} - {CLS, SEP}
        second = {t for t, s in zip(ids, types) if s == 1} - {SEP}
        return len(first & second) - 1.0

    def _vector(self, ids: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(zlib.crc32(np.asarray(ids, dtype=np.int64).tobytes()))
        return (rng.standard_normal(self.info.dimension) * len(ids)).astype(np.float32)

    def run_tokens(self, batch: TokenBatch, seq_len: int,
                   wide: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise BackendError("the fake backend gives no token states (its info.token_dimension is 0)")

    def self_check(self) -> None:
        pass  # no recorded vectors to compare with

    def warmup(self, max_batch_tokens: int | None = None, max_batch_requests: int | None = None) -> None:
        self.run(self.tokenize(["warm up"]), self.pad_to_multiple_of)
        self.passes.clear()
        self.wide.clear()
        self.padded_tokens.clear()
        self.most_running = 0

    def health(self) -> None:
        if not self.healthy:
            raise BackendError("fake backend marked unhealthy")
