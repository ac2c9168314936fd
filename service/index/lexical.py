"""A collection's lexical index: BM25 (bm25s) over the text of every stored item, beside its vectors.

The text is tokenised once, when the committer applies a write (lowercased words of two or more
letters or digits, English stop words left out); the BM25 structure over the live items is built
from those tokens when a lexical search finds it older than the collection's last change, and
kept until the next one. It is derived only from the live items' tokens, in slot order, so the
log's replay and a snapshot's load (which keep that order) give the same scores and the same
ranking: the index needs no file of its own, the write-ahead log and the snapshots' documents
carry its text.

Reciprocal rank fusion (`fuse`; Cormack, Clarke & Büttcher 2009, whose k = 60 is the default) merges the
dense and the lexical ranking of a hybrid search.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import bm25s
import numpy as np

MODES = ("dense", "lexical", "hybrid")
DEFAULT_CANDIDATES = 100  # per ranking a hybrid search fuses (at least k)


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    return bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


class _Built:
    """One BM25 structure over `rows` (slots), valid for the collection's `version`."""

    def __init__(self, version: int, rows: np.ndarray, tokens: list[list[str]]):
        self.version = version
        self.rows = rows
        self.bm25: bm25s.BM25 | None = None
        if len(rows):
            self.bm25 = bm25s.BM25(method="lucene")
            self.bm25.index(tokens, show_progress=False)


class LexicalIndex:
    """Tokens by slot (written by the committer only) and the BM25 structure searches build from them."""

    def __init__(self) -> None:
        self._tokens: list[list[str]] = []  # by slot; a slot's tokens never change once written
        self._built: _Built | None = None
        self._build_lock = threading.Lock()  # one build at a time; searches wait for it, not build it twice

    @property
    def count(self) -> int:
        """Slots below this have their tokens stored."""
        return len(self._tokens)

    def add(self, first_slot: int, texts: Sequence[str]) -> None:
        if first_slot != len(self._tokens):
            raise RuntimeError(f"lexical index out of step: slot {first_slot} written after {len(self._tokens)}")
        self._tokens.extend(tokenize(texts))

    def search(self, texts: Sequence[str], k: int, version: int, live: Callable[[int], np.ndarray],
               allowed: np.ndarray | None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query, (scores, slots) of up to k items sharing a term with it, best first (ties: the
        earlier slot first); only slots in `allowed` (ascending) when given. `live(n)` is the live flags
        of the first n slots, read for `version` (the collection's count of changes)."""
        built = self._current(version, live)
        out = []
        queries = tokenize(texts)
        for terms in queries:
            if built.bm25 is None:
                out.append((np.empty(0, np.float32), np.empty(0, np.int64)))
                continue
            ids = built.bm25.get_tokens_ids(terms)
            scores = built.bm25.get_scores_from_ids(ids) if ids else np.zeros(len(built.rows), np.float32)
            if allowed is not None:
                scores = np.where(np.isin(built.rows, allowed, assume_unique=True), scores, 0)
            hits = np.flatnonzero(scores > 0)
            order = hits[np.lexsort((hits, -scores[hits]))][:k]  # by score, then slot: a stable ranking
            out.append((scores[order].astype(np.float32), built.rows[order].astype(np.int64)))
        return out

    def _current(self, version: int, live: Callable[[int], np.ndarray]) -> _Built:
        built = self._built
        if built is not None and built.version == version:
            return built
        with self._build_lock:
            built = self._built
            if built is not None and built.version == version:
                return built
            n = len(self._tokens)
            rows = np.flatnonzero(live(n))
            built = _Built(version, rows, [self._tokens[r] for r in rows.tolist()])
            if self._built is None or self._built.version < version:
                self._built = built
            return built


def fuse(rankings: Sequence[tuple[np.ndarray, float]], k: int, rrf_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal rank fusion: each item scores the sum over rankings of weight / (rrf_k + its rank),
    ranks counted from 1; `rankings` are (slots best first, weight). Returns the top k (scores, slots),
    ties broken by the earlier slot."""
    fused: dict[int, float] = {}
    for slots, weight in rankings:
        for rank, slot in enumerate(slots.tolist(), start=1):
            fused[slot] = fused.get(slot, 0.0) + weight / (rrf_k + rank)
    if not fused:
        return np.empty(0, np.float32), np.empty(0, np.int64)
    slots = np.fromiter(fused.keys(), np.int64, len(fused))
    scores = np.fromiter(fused.values(), np.float64, len(fused))
    order = np.lexsort((slots, -scores))[:k]
    return scores[order].astype(np.float32), slots[order]
