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
its segment, and tantivy-py offers no merge that expunges deletes. So once the deleted items are
over `rebuild_at` of those indexed, a new index is built aside from the live items (what the log's
replay and a snapshot's load build too): a builder thread reads them and indexes them while writes
and searches go on against the current index, the writes made meanwhile are kept in a journal and
replayed into the new index, and the last few of them and the swap happen under the writer's lock.
Right after a rebuild the scores are those of an index of the live items alone; between rebuilds
they differ from those by the deleted items still counted (about `rebuild_at` of the index at most:
a delete made while a rebuild runs is counted by the index it swaps in). Ties are broken by slot, so
a ranking depends only on scores and write order.

The index holds no file of its own: the write-ahead log and the snapshots' documents carry its text.

Reciprocal rank fusion (`fuse`; Cormack, Clarke & Büttcher 2009, whose k = 60 is the default) merges the
dense and the lexical ranking of a hybrid search.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import tantivy

log = logging.getLogger("sembed.index")

MODES = ("dense", "lexical", "hybrid")
DEFAULT_CANDIDATES = 100  # per ranking a hybrid search fuses (at least k)
TERM_SET_MAX = 2048  # a filter allowing up to this many slots joins the query; a larger one filters its hits
WRITER_HEAP = 32_000_000  # bytes tantivy's writer buffers before it writes a segment (tantivy's minimum: 15 MB)
REBUILD_AT = 0.25  # rebuild from the live items once deleted ones are over this fraction of those indexed
SWAP_TAIL = 64  # a rebuild replays the journal outside the lock until at most this many changes are left
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


#: a journal entry: (first slot, texts) an add, (None, slots) a remove
_Change = tuple[int | None, list]


class LexicalIndex:
    """Items by slot in an in-memory tantivy index; the owner (a collection's committer) adds and removes,
    searches commit. `live(end)`: the live items' (slots, texts) below slot `end`, which a rebuild indexes
    (None: never rebuilt); with `background` false a rebuild runs in the owner's call (tests, tools)."""

    def __init__(self, live: Callable[[int], tuple[list[int], list[str]]] | None = None,
                 rebuild_at: float = REBUILD_AT, background: bool = True) -> None:
        if not 0 <= rebuild_at <= 1:
            raise ValueError(f"rebuild_at is a fraction between 0 and 1, not {rebuild_at}")
        self._schema = _schema()
        self._index, self._writer = self._open()
        self._lock = threading.Lock()  # the writer: the owner's adds and deletes, a search's commit, a swap
        self._pending = False  # changes not committed yet
        self._count = 0
        self._live, self._rebuild_at, self._background = live, rebuild_at, background
        self._items = 0  # live items (the owner's count)
        self._indexed = 0  # items the tantivy index holds, deleted ones included (changed under the lock)
        self._journal: list[_Change] | None = None  # while a rebuild runs: the changes since it began
        self._builder: threading.Thread | None = None
        self._closed = False

    def _open(self) -> tuple[tantivy.Index, tantivy.IndexWriter]:
        index = tantivy.Index(self._schema)  # no path: in memory
        index.register_tokenizer(_WORDS, _analyzer())
        return index, index.writer(WRITER_HEAP, 1)

    @property
    def count(self) -> int:
        """Slots below this are indexed."""
        return self._count

    @property
    def deleted(self) -> int:
        """Deleted or replaced items the index still counts in its statistics."""
        return self._indexed - self._items

    def add(self, first_slot: int, texts: Sequence[str]) -> None:
        if first_slot != self._count:
            raise RuntimeError(f"lexical index out of step: slot {first_slot} written after {self._count}")
        texts = list(texts)
        with self._lock:
            self._apply(self._writer, (first_slot, texts))
            self._indexed += len(texts)
            if self._journal is not None:
                self._journal.append((first_slot, texts))
            self._pending = True
        self._count += len(texts)
        self._items += len(texts)

    def remove(self, slots: Sequence[int]) -> None:
        if not len(slots):
            return
        change: _Change = (None, [int(s) for s in slots])
        with self._lock:
            self._apply(self._writer, change)
            if self._journal is not None:
                self._journal.append(change)
            self._pending = True
        self._items -= len(change[1])
        if self._live is not None and self._journal is None and not self._closed and \
                self.deleted > self._rebuild_at * self._indexed:
            self._start_rebuild()

    def _apply(self, writer: tantivy.IndexWriter, change: _Change) -> None:
        first_slot, values = change
        if first_slot is None:
            writer.delete_documents_by_query(tantivy.Query.term_set_query(self._schema, _SLOT, values))
            return
        for slot, text in enumerate(values, first_slot):
            doc = tantivy.Document()
            doc.add_text(_TEXT, text)
            doc.add_unsigned(_SLOT, slot)
            writer.add_document(doc)

    def fill(self, end: int) -> None:
        """Index the live items below slot `end` (this index is new: a collection that held texts before it)."""
        assert self._live is not None and not self._count
        slots, texts = self._live(end)
        with self._lock:
            for slot, text in zip(slots, texts):
                self._apply(self._writer, (slot, [text]))
            self._indexed, self._pending = len(slots), True
        self._count, self._items = end, len(slots)

    def close(self) -> None:
        """A rebuild under way stops at its next step, and nothing is swapped in."""
        self._closed = True

    # rebuilding from the live items ------------------------------------------------------------------

    def _start_rebuild(self) -> None:
        """The owner's thread: the journal starts now, so the builder sees every change after `end`'s items."""
        with self._lock:
            self._journal = []
        end = self._count
        if not self._background:
            self._rebuild(end)
            return
        self._builder = threading.Thread(target=self._rebuild, args=(end,), name="lexical-rebuild", daemon=True)
        self._builder.start()

    def wait(self) -> None:
        """Until a rebuild under way has swapped its index in (tests, tools)."""
        builder = self._builder
        if builder is not None:
            builder.join()

    def _rebuild(self, end: int) -> None:
        try:
            swapped = self._build(end)
        except Exception:  # the current index stays, complete: only its statistics keep the deleted items
            log.exception("rebuilding a lexical index failed; it keeps its deleted items until the next try")
            swapped = False
        if not swapped:  # else the swap ended the journal (and the owner may have begun the next one since)
            with self._lock:
                self._journal = None

    def _build(self, end: int) -> bool:
        """A new index of the live items below `end` (read now: an item deleted since the journal began is
        either left out here or deleted by its journal entry), then the journal's changes, committed in
        rounds outside the lock; once what is left is short, it is applied, committed and the index swapped
        in under the lock (so a searcher, old or new, always holds every acknowledged write)."""
        began = time.monotonic()
        assert self._live is not None
        slots, texts = self._live(end)
        index, writer = self._open()
        for n, (slot, text) in enumerate(zip(slots, texts)):
            if n % 10_000 == 0 and self._closed:
                return False
            self._apply(writer, (slot, [text]))
        done = 0
        while True:
            writer.commit()
            if self._closed:
                return False
            with self._lock:
                journal = self._journal
                assert journal is not None
                tail = journal[done:]
                if len(tail) <= SWAP_TAIL:
                    for change in tail:
                        self._apply(writer, change)
                    writer.commit()
                    index.reload()
                    indexed = len(slots) + sum(len(values) for first, values in journal if first is not None)
                    dropped = self._indexed - indexed
                    old = self._index, self._writer
                    self._index, self._writer, self._indexed = index, writer, indexed
                    self._pending, self._journal = False, None
                    break
            for change in tail:  # outside the lock: writes and searches go on meanwhile
                self._apply(writer, change)
            done += len(tail)
        del old  # the old writer's threads end outside the lock
        log.info("lexical index rebuilt from %d live items (%d deleted ones dropped) in %.1f s", len(slots),
                 dropped, time.monotonic() - began)
        return True

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
