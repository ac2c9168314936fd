"""A model-free backend for tests of the queue, the engine and the routes (Infinity's dummy model).

Words are tokens. A row's vector depends only on its own token ids, never on the batch, so a test
can tell exactly which rows went where. The word FAIL makes any batch holding it raise, as a real
runtime does on an input it cannot handle; `gate` holds passes back so a test can fill the queue.
As a cross-encoder (`kind="cross-encoder"`) a pair's score is the number of distinct words its two
sides share, minus one: a test knows the ranking /rerank must give.
"""

from __future__ import annotations

import hashlib
import threading
import time
import zlib

import numpy as np

from service.backends.base import BackendError, BackendInfo, Tokenized
from service.manifest import CROSS_ENCODER, EMBEDDING

CLS, SEP, FAIL = 101, 102, 999


class FakeBackend:
    def __init__(self, name: str = "fake", dimension: int = 8, max_seq_length: int = 32,
                 pad_to_multiple_of: int = 16, seconds_per_token: float = 0.0, kind: str = EMBEDDING):
        if kind == CROSS_ENCODER:
            dimension = 1  # the score
        self.info = BackendInfo(model=name, dimension=dimension, max_seq_length=max_seq_length, device="cpu",
                                manifest={"name": name, "dimension": dimension, "max_seq_length": max_seq_length,
                                          "kind": kind},
                                vocab_size=31000, kind=kind,
                                graph_sha256=hashlib.sha256(f"fake:{name}:{dimension}".encode()).hexdigest())
        self.pad_to_multiple_of = pad_to_multiple_of
        self.seconds_per_token = seconds_per_token
        self.gate = threading.Event()
        self.gate.set()
        self.passes: list[list[int]] = []  # the unpadded lengths of each forward pass's rows
        self.padded_tokens: list[int] = []  # rows × seq_len of each pass
        self.healthy = True

    def tokenize(self, texts: list[str], truncation_direction: str = "right") -> list[Tokenized]:
        out, keep = [], self.info.max_seq_length - 2
        for text in texts:
            words = [self._id(w) for w in text.split()]
            if len(words) > keep:
                words = words[-keep:] if truncation_direction == "left" else words[:keep]
            out.append(Tokenized([CLS, *words, SEP], None, len(text.split()) + 2))
        return out

    def tokenize_pairs(self, query: str, texts: list[str], truncation_direction: str = "right") -> list[Tokenized]:
        out, keep = [], self.info.max_seq_length - 3
        first = [self._id(w) for w in query.split()]
        for text in texts:
            a, b = list(first), [self._id(w) for w in text.split()]
            original = len(a) + len(b) + 3
            while len(a) + len(b) > keep:  # the longer side loses a word first
                longer = a if len(a) >= len(b) else b
                del longer[0 if truncation_direction == "left" else -1]
            out.append(Tokenized([CLS, *a, SEP, *b, SEP], [0] * (len(a) + 2) + [1] * (len(b) + 1), original))
        return out

    def token_details(self, texts: list[str], add_special_tokens: bool = True) -> list[list[dict]]:
        out = []
        for text in texts:
            tokens, start = [], 0
            for word in text.split():
                start = text.index(word, start)
                tokens.append({"id": self._id(word), "text": word, "special": False, "start": start,
                               "stop": start + len(word)})
                start += len(word)
            special = [{"id": i, "text": t, "special": True, "start": None, "stop": None}
                       for i, t in ((CLS, "[CLS]"), (SEP, "[SEP]"))]
            out.append([special[0], *tokens, special[1]] if add_special_tokens else tokens)
        return out

    @staticmethod
    def _id(word: str) -> int:
        return FAIL if word == "FAIL" else 1000 + zlib.crc32(word.encode()) % 30000

    def run(self, items: list[Tokenized], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        self.gate.wait()
        assert all(i.length <= seq_len for i in items), "a row longer than its batch"
        self.passes.append([i.length for i in items])
        self.padded_tokens.append(len(items) * seq_len)
        if self.seconds_per_token:
            time.sleep(self.seconds_per_token * len(items) * seq_len)
        if any(FAIL in i.ids for i in items):
            raise BackendError("fake backend: the batch holds FAIL")
        if self.info.is_cross_encoder:
            scores = np.array([[self._score(i)] for i in items], dtype=np.float32)
            return scores, scores
        raw = np.stack([self._vector(i.ids) for i in items])
        return raw / np.linalg.norm(raw, axis=1, keepdims=True), raw

    @staticmethod
    def _score(item: Tokenized) -> float:
        types = item.type_ids or [0] * item.length
        first = {t for t, s in zip(item.ids, types) if s == 0} - {CLS, SEP}
        second = {t for t, s in zip(item.ids, types) if s == 1} - {SEP}
        return len(first & second) - 1.0

    def _vector(self, ids: list[int]) -> np.ndarray:
        rng = np.random.default_rng(zlib.crc32(np.asarray(ids, dtype=np.int64).tobytes()))
        return (rng.standard_normal(self.info.dimension) * len(ids)).astype(np.float32)

    def warmup(self) -> None:
        self.run(self.tokenize(["warm up"]), self.pad_to_multiple_of)
        self.passes.clear()
        self.padded_tokens.clear()

    def health(self) -> None:
        if not self.healthy:
            raise BackendError("fake backend marked unhealthy")
