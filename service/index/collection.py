"""One collection in memory: the document store (id → slots → text, metadata) over a VectorSet.

A document is one slot per chunk (one for a short text), its chunks' slots consecutive: each holds the
document and that chunk's span. Searches rank chunks and answer documents, each at its best chunk.

Only the committer thread of LocalIndex changes a collection, after the change is durable in the
log; searches and reads run beside it without a lock: the per-slot document list only grows or
has entries set to None, and a slot's vector never changes once written.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import scipy.sparse as sp

from service.index.base import CollectionInfo, CollectionSpec, Document, Hit, Record, SearchParams, SparseRows
from service.index.filters import parse_filter
from service.index.lexical import DEFAULT_CANDIDATES, REBUILD_AT, LexicalIndex, fuse
from service.index.metadata import MetadataIndex
from service.index.sparse import SparseStore
from service.index.vectors import DEFAULT_OVERSAMPLE, LiveRows, VectorSet


class Collection:
    def __init__(self, spec: CollectionSpec, background: bool = True, gpu: str = "auto",
                 oversample: int = DEFAULT_OVERSAMPLE, float_dir: Path | None = None,
                 lexical_rebuild: float = REBUILD_AT):
        self.spec = spec
        self.vectors = VectorSet(spec.dimension, spec.index_type, background=background, gpu_mode=gpu,
                                 quantization=spec.quantization, oversample=oversample, float_dir=float_dir)
        self._docs: list[Document | None] = []  # by slot: a chunked document at each of its chunks' slots
        self._spans: list[tuple[int, int]] = []  # by slot: the chunk's span in its document's text
        self._slot_of: dict[str, int] = {}  # id → its first slot; its other chunks' follow it
        self._metadata = MetadataIndex()  # filters as numpy masks over slots
        self._background, self._lexical_rebuild = background, lexical_rebuild
        self.lexical = self._new_lexical() if spec.lexical else None  # BM25 over the items' text (opt-in)
        # a sparse model's vector per slot (opt-in)
        self.sparse = SparseStore(spec.sparse_dimension) if spec.sparse_model is not None else None
        self.sequence = 0
        self.frozen: str | None = None  # why writes are refused for now (a re-embed is reading it)
        # A filter's allowed slots are cached until the next change (`_version` moves after a write is
        # complete, so a search never caches a half-applied write).
        self._version = 0
        self._filter_cache: dict[str, tuple[int, np.ndarray]] = {}
        self._cache_lock = threading.Lock()

    def __len__(self) -> int:
        """Documents (chunks: self.vectors.count)."""
        return len(self._slot_of)

    def info(self) -> CollectionInfo:
        s = self.spec
        return CollectionInfo(s.name, s.dimension, s.index_type, s.model, len(self), self.sequence,
                              self.vectors.ann_ready, s.quantization, s.lexical, s.sparse_model, s.sparse_dimension)

    # writes (the committer thread, after the log holds them) ------------------------------------

    def upsert(self, documents: list[Document], vectors: np.ndarray, sparse: SparseRows | None = None) -> None:
        """`sparse`: the chunks' sparse vectors, given exactly when the collection keeps them (LocalIndex checks)."""
        self._remove([d.id for d in documents])
        slots = self.vectors.append(vectors)
        by_slot = [d for d in documents for _ in range(d.rows)]
        self._spans.extend(span for d in documents for span in d.spans())  # before the documents: a reader
        self._docs.extend(by_slot)  # that finds a slot's document finds its span
        first = 0
        for doc in documents:
            self._slot_of[doc.id] = int(slots[first])
            first += doc.rows
        if len(slots):
            self._metadata.add(int(slots[0]), [d.metadata for d in by_slot], self.vectors.live_flags())
            if self.lexical is not None:  # after the documents: a slot the lexical index holds has its document
                self.lexical.add(int(slots[0]), [d.text[a:b] for d in documents for a, b in d.spans()])  # by chunk
            if self.sparse is not None and sparse is not None:  # the same slots as the chunks' dense vectors
                self.sparse.append(int(slots[0]), sparse, self.vectors.live_flags())
        self._version += 1

    def delete(self, ids: list[str]) -> int:
        return self._remove(ids)

    def _remove(self, ids: list[str]) -> int:
        firsts = [self._slot_of.pop(i) for i in ids if i in self._slot_of]
        slots = [slot for first in firsts for slot in range(first, first + cast(Document, self._docs[first]).rows)]
        for slot in slots:
            self._docs[slot] = None
        self.vectors.kill(np.asarray(slots, dtype=np.int64))
        if self.lexical is not None:
            self.lexical.remove(slots)
        self._version += 1
        return len(firsts)

    def close(self) -> None:
        self.vectors.close()
        if self.lexical is not None:
            self.lexical.close()

    def set_lexical(self, on: bool) -> None:
        """Build a lexical index of the stored texts, or drop it (the committer thread; the index before the spec
        when adding, after it when dropping, so a search the spec lets through finds one)."""
        if on and self.lexical is None:
            lexical = self._new_lexical()
            lexical.fill(len(self._docs))
            self.lexical = lexical
        self.spec = replace(self.spec, lexical=on)
        if not on and self.lexical is not None:
            self.lexical.close()
            self.lexical = None

    def _new_lexical(self) -> LexicalIndex:
        return LexicalIndex(self._live_texts, self._lexical_rebuild, self._background)

    def _live_texts(self, end: int) -> tuple[list[int], list[str]]:
        """The live items' slots and texts below slot `end`, for the lexical index's rebuild (in its thread:
        a slot's document is only ever set to None, after its span was written)."""
        slots, texts = [], []
        for slot in range(end):
            doc = self._docs[slot]
            if doc is not None:
                start, stop = self._spans[slot]
                slots.append(slot)
                texts.append(doc.text[start:stop])
        return slots, texts

    # reads ------------------------------------------------------------------------------------

    def ids_matching(self, filter_spec: dict[str, Any]) -> list[str]:
        """Called by the committer, so no slot it returns can have been emptied meanwhile."""
        return list(dict.fromkeys(self._docs[slot].id for slot in self._allowed(filter_spec).tolist()))

    def _allowed(self, filter_spec: dict[str, Any]) -> np.ndarray:
        """The live slots whose metadata passes the filter, ascending."""
        node = parse_filter(filter_spec)
        key = json.dumps(filter_spec, sort_keys=True)
        version = self._version
        with self._cache_lock:
            cached = self._filter_cache.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        n = self._metadata.count  # slots below it have their document and metadata stored
        mask = self._metadata.mask(node, n)
        mask &= self.vectors.live_flags()[:n]  # read after the mask (a merge drops only dead slots)
        allowed = np.flatnonzero(mask)
        with self._cache_lock:
            if len(self._filter_cache) >= 64:
                self._filter_cache.pop(next(iter(self._filter_cache)))
            self._filter_cache[key] = (version, allowed)
        return allowed

    def get(self, ids: list[str], with_vector: bool = False) -> list[Record]:
        records = []
        for i in ids:
            slot = self._slot_of.get(i)
            if slot is None:
                continue
            doc = self._docs[slot]
            if doc is not None:
                vector = self.vectors.vector(slot) if with_vector else None
                if with_vector and vector is None:  # deleted while we read
                    continue
                records.append(Record(doc.id, doc.text, doc.metadata, None if vector is None else vector.tolist()))
        return records

    def scan(self, batch: int):
        for start in range(0, len(self._docs), batch):
            # a document once, at its first slot
            docs = [d for slot, d in enumerate(self._docs[start: start + batch], start)
                    if d is not None and self._slot_of.get(d.id) == slot]
            if docs:
                yield [Record(d.id, d.text, d.metadata, spans=None if d.chunks is None else d.spans()) for d in docs]

    def search(self, queries: np.ndarray | None, params: SearchParams) -> list[list[Hit]]:
        allowed = None if params.filter is None else self._allowed(params.filter)
        chunks, documents = self.vectors.count, len(self._slot_of)
        # Chunks are ranked, documents answered: enough chunks that k documents are among them. With one chunk
        # per document that is k; else k × twice the mean chunks per document, doubled while a query comes back
        # short of k documents and more chunks remain.
        fetch = params.k if chunks <= documents else params.k * 2 * -(-chunks // max(documents, 1))
        while True:
            fetch = min(fetch, max(chunks, params.k))
            ranked = params if fetch == params.k else replace(
                params, k=fetch, ef_search=None if params.ef_search is None else max(params.ef_search, fetch))
            results, short = [], False
            for row_scores, row_slots in self._rankings(queries, ranked, allowed):
                hits, more = self._collapse(row_scores.tolist(), row_slots.tolist(), params, fetch)
                results.append(hits)
                short |= more and len(hits) < params.k
            if not short or fetch >= chunks:
                return results
            fetch *= 2

    def _collapse(self, scores: list[float], slots: list[int], params: SearchParams,
                  fetch: int) -> tuple[list[Hit], bool]:
        """A query's ranked chunks as documents (best first, each at its best chunk), and whether more
        chunks passing the threshold may follow the `fetch` ranked."""
        hits: dict[str, Hit] = {}
        passed = 0
        for score, slot in zip(scores, slots):
            doc = self._docs[slot] if slot >= 0 else None
            if doc is None or (params.score_threshold is not None and score < params.score_threshold):
                continue
            passed += 1
            start, end = self._spans[slot]
            hit = hits.get(doc.id)
            if hit is not None:  # a later (worse) chunk of a document already found
                if hit.chunks is not None:
                    hit.chunks.append((start, end, score))
                continue
            if len(hits) == params.k:
                continue
            vector = self.vectors.vector(slot) if params.with_vector else None
            if params.with_vector and vector is None:  # deleted while we searched
                continue
            hits[doc.id] = Hit(doc.id, doc.text if params.with_text else None,
                               doc.metadata if params.with_metadata else None,
                               None if vector is None else vector.tolist(), score=score, start=start, end=end,
                               chunks=[(start, end, score)] if params.with_chunks else None)
        return list(hits.values()), len(slots) >= fetch and passed == len(slots)

    def _rankings(self, queries: np.ndarray | None, params: SearchParams,
                  allowed: np.ndarray | None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query, (scores, slots) best first, as params.mode ranks them (LocalIndex.search has checked
        that the mode has what it needs)."""
        if params.mode == "dense":
            assert queries is not None
            return self._dense(queries, params.k, params, allowed)
        if params.mode == "lexical":
            assert self.lexical is not None and params.texts is not None
            return self.lexical.search(params.texts, params.k, allowed)
        if params.mode == "sparse":
            return self._sparse(params, params.k, allowed)
        assert queries is not None
        k = max(params.k, params.candidates or DEFAULT_CANDIDATES)
        # hybrid: the dense ranking and each other one the collection keeps, with its weight
        rankings = [[(slots, params.dense_weight) for _, slots in self._dense(queries, k, params, allowed)]]
        if self.lexical is not None:
            assert params.texts is not None
            rankings.append([(slots, params.lexical_weight) for _, slots in self.lexical.search(params.texts, k,
                                                                                                allowed)])
        if self.sparse is not None:
            rankings.append([(slots, params.sparse_weight) for _, slots in self._sparse(params, k, allowed)])
        return [fuse(list(per_query), params.k, params.rrf_k) for per_query in zip(*rankings)]

    def _sparse(self, params: SearchParams, k: int, allowed: np.ndarray | None) -> list[tuple[np.ndarray, np.ndarray]]:
        assert self.sparse is not None and params.sparse_queries is not None
        return self.sparse.search(params.sparse_queries, k, self.vectors.live_flags(), allowed)

    def _dense(self, queries: np.ndarray, k: int, params: SearchParams,
               allowed: np.ndarray | None) -> list[tuple[np.ndarray, np.ndarray]]:
        scores, slots = self.vectors.search(queries, k, allowed, params.ef_search, params.nprobe, params.oversample)
        kept = slots >= 0  # padding: fewer than k candidates
        return [(row_scores[keep], row_slots[keep]) for row_scores, row_slots, keep in zip(scores, slots, kept)]

    # snapshots --------------------------------------------------------------------------------

    def capture(self) -> tuple[CollectionSpec, LiveRows, np.ndarray, list[Document], int, np.ndarray | None,
                               Callable[[np.ndarray], sp.csr_array] | None]:
        """(spec, vectors, live rows, their documents (each once: its chunks are consecutive rows), sequence,
        int8 ranges, what gives the sparse vectors of rows as the store holds them now), called by the committer
        between writes; the snapshot thread gathers vectors[rows] later (VectorSet.view: written rows
        never change, and the structure holding some of them is kept as it is now)."""
        vectors, live = self.vectors.view()
        rows = np.flatnonzero(live)
        docs = self._docs[: len(live)]
        # a live slot holds its document; a document's chunks are consecutive slots, all live or all dead
        live_docs = cast(list[Document], [docs[r] for r in rows.tolist() if r == 0 or docs[r - 1] is not docs[r]])
        sparse = None
        if self.sparse is not None:
            sparse = partial(self.sparse.rows, self.sparse.view())
        return self.spec, vectors, rows, live_docs, self.sequence, self.vectors.ranges, sparse
