"""A collection's lexical index: BM25 (tantivy, in memory) over the text of every stored item, beside its vectors.

Each item (a document, or each chunk of a long one) is a tantivy document holding its slot; a write
adds its items and deletes the slots it replaces or removes (one delete by a set of slots). Changes
are buffered in tantivy's writer and committed by the first lexical search after them (a commit
writes only the new segment: its cost follows the change, not the collection), then searchers are
reloaded. Tantivy writes segments itself when its writer's buffer fills, and merges them in the
background.

Words: lowercased runs of two or more letters or digits (`\\w\\w+`), English stop words left out,
stemmed (Snowball English: "printers" matches "printer"). Scores are tantivy's BM25 (k1 = 1.2,
b = 0.75, idf = ln(1 + (N - n + 0.5) / (n + 0.5))). As in Lucene, its statistics (document count,
document frequencies, average length) count a deleted or replaced item until a merge drops it from
its segment, so after deletes scores can differ a little from those of an index built from the live
items alone (which is what the log's replay and a snapshot's load build). Ties are broken by slot,
so a ranking depends only on scores and write order.

The index holds no file of its own: the write-ahead log and the snapshots' documents carry its text.

Reciprocal rank fusion (`fuse`; Cormack, Clarke & Büttcher 2009, whose k = 60 is the default) merges the
dense and the lexical ranking of a hybrid search.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np
import tantivy

MODES = ("dense", "lexical", "hybrid")
DEFAULT_CANDIDATES = 100  # per ranking a hybrid search fuses (at least k)
TERM_SET_MAX = 2048  # a filter allowing up to this many slots joins the query; a larger one filters its hits
WRITER_HEAP = 32_000_000  # bytes tantivy's writer buffers before it writes a segment (tantivy's minimum: 15 MB)
_TEXT, _SLOT, _WORDS = "text", "slot", "words"


def _analyzer() -> tantivy.TextAnalyzer:
    return (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.regex(r"\w\w+"))
            .filter(tantivy.Filter.lowercase())
            .filter(tantivy.Filter.stopword("english"))
            .filter(tantivy.Filter.stemmer("english"))
            .build())


_ANALYZER = _analyzer()
_ANALYZER_LOCK = threading.Lock()  # one text at a time through the shared analyzer


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    """The words of each text as the index stores them."""
    with _ANALYZER_LOCK:
        return [_ANALYZER.analyze(t) for t in texts]


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field(_TEXT, tokenizer_name=_WORDS, index_option="freq")  # BM25 needs frequencies only
    builder.add_unsigned_field(_SLOT, indexed=True, fast=True)  # deletes by slot; hits read it as a column
    return builder.build()


class LexicalIndex:
    """Items by slot in an in-memory tantivy index; the committer adds and removes, searches commit."""

    def __init__(self) -> None:
        self._schema = _schema()
        self._index = tantivy.Index(self._schema)  # no path: in memory
        self._index.register_tokenizer(_WORDS, _analyzer())
        self._writer = self._index.writer(WRITER_HEAP, 1)
        self._lock = threading.Lock()  # the writer: the committer's adds and deletes, a search's commit
        self._pending = False  # changes not committed yet
        self._count = 0

    @property
    def count(self) -> int:
        """Slots below this are indexed."""
        return self._count

    def add(self, first_slot: int, texts: Sequence[str]) -> None:
        if first_slot != self._count:
            raise RuntimeError(f"lexical index out of step: slot {first_slot} written after {self._count}")
        with self._lock:
            for slot, text in enumerate(texts, first_slot):
                doc = tantivy.Document()
                doc.add_text(_TEXT, text)
                doc.add_unsigned(_SLOT, slot)
                self._writer.add_document(doc)
            self._pending = True
        self._count += len(texts)

    def remove(self, slots: Sequence[int]) -> None:
        if not len(slots):
            return
        with self._lock:
            self._writer.delete_documents_by_query(tantivy.Query.term_set_query(self._schema, _SLOT, list(slots)))
            self._pending = True

    def _searcher(self) -> tantivy.Searcher:
        """A searcher over every change made so far: the pending ones are committed first."""
        if self._pending:
            with self._lock:
                if self._pending:
                    self._writer.commit()
                    self._index.reload()
                    self._pending = False
        return self._index.searcher()

    def search(self, texts: Sequence[str], k: int,
               allowed: np.ndarray | None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query, (scores, slots) of up to k items sharing a word with it, best first (ties: the
        earlier slot first); only slots in `allowed` (ascending) when given."""
        searcher = self._searcher()
        return [self._top(searcher, sorted(set(words)), k, allowed) for words in tokenize(texts)]

    def _top(self, searcher: tantivy.Searcher, words: list[str], k: int,
             allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        if not words or not searcher.num_docs or (allowed is not None and not len(allowed)):
            return np.empty(0, np.float32), np.empty(0, np.int64)
        query = tantivy.Query.boolean_query([
            (tantivy.Occur.Should, tantivy.Query.term_query(self._schema, _TEXT, w, index_option="freq"))
            for w in words])
        post_filter = allowed if allowed is not None and len(allowed) > TERM_SET_MAX else None
        fetch = k
        if post_filter is not None:  # enough hits that k of them are likely allowed
            fetch = k * 2 * math.ceil(searcher.num_docs / len(post_filter))
        elif allowed is not None:  # the allowed slots as a clause that adds 0 to the score
            only = tantivy.Query.const_score_query(
                tantivy.Query.term_set_query(self._schema, _SLOT, allowed.tolist()), 0.0)
            query = tantivy.Query.boolean_query([(tantivy.Occur.Must, query), (tantivy.Occur.Must, only)])
        while True:
            hits = searcher.search(query, fetch, count=False).hits
            scores = np.fromiter((s for s, _ in hits), np.float32, len(hits))
            slots = np.asarray(searcher.fast_field_values(_SLOT, [a for _, a in hits]), np.int64)
            if post_filter is not None:
                keep = np.isin(slots, post_filter, assume_unique=True)
                kept_scores, kept_slots = scores[keep], slots[keep]
            else:
                kept_scores, kept_slots = scores, slots
            # Done when every match is in, or k are and the rest score below the k-th (no tie across the cut).
            if len(hits) < fetch or fetch >= searcher.num_docs or (
                    len(kept_scores) >= k and scores[-1] < np.sort(kept_scores)[-k]):
                break
            fetch = min(fetch * 4, searcher.num_docs)
        order = np.lexsort((kept_slots, -kept_scores))[:k]  # by score, then slot: a stable ranking
        return kept_scores[order], kept_slots[order]


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
