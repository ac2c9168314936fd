"""The vector index behind /search: an interface, and an exact FAISS inner-product implementation.

Vectors are L2-normalised before they reach the index, so inner product is cosine similarity.
String ids map to int64 FAISS ids; re-adding an id replaces its vector and payload.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import faiss
import numpy as np


@dataclass
class Document:
    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Hit:
    id: str
    score: float
    text: str
    metadata: dict[str, Any]


class VectorIndex(Protocol):
    dim: int

    def __len__(self) -> int: ...

    def add(self, documents: list[Document], vectors: np.ndarray) -> None: ...

    def search(self, queries: np.ndarray, k: int) -> list[list[Hit]]: ...

    def delete(self, ids: list[str]) -> int: ...

    def clear(self) -> None: ...


class FaissIndex:
    """Exact search (IndexFlatIP) under an id map; a lock keeps writes and reads consistent."""

    def __init__(self, dim: int, path: Path | None = None):
        self.dim = dim
        self.path = Path(path) if path else None
        self._lock = threading.RLock()
        self._reset()
        if self.path and (self.path / self.SNAPSHOT).is_file():
            self._load()

    def _reset(self) -> None:
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        self._docs: dict[int, Document] = {}
        self._ids: dict[str, int] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return self._index.ntotal

    def add(self, documents: list[Document], vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape != (len(documents), self.dim):
            raise ValueError(f"expected vectors of shape ({len(documents)}, {self.dim}), got {vectors.shape}")
        with self._lock:
            self._remove([d.id for d in documents if d.id in self._ids])
            int_ids = np.arange(self._next_id, self._next_id + len(documents), dtype=np.int64)
            self._next_id += len(documents)
            self._index.add_with_ids(vectors, int_ids)
            for int_id, doc in zip(int_ids.tolist(), documents):
                self._docs[int_id] = doc
                self._ids[doc.id] = int_id
            self._commit()

    def search(self, queries: np.ndarray, k: int) -> list[list[Hit]]:
        with self._lock:
            if len(self) == 0:
                return [[] for _ in range(len(queries))]
            scores, ids = self._index.search(np.ascontiguousarray(queries, dtype=np.float32), min(k, len(self)))
            hits = []
            for row_s, row_i in zip(scores, ids):
                docs = [(self._docs[i], s) for s, i in zip(row_s, row_i) if i >= 0]
                hits.append([Hit(d.id, float(s), d.text, d.metadata) for d, s in docs])
            return hits

    def delete(self, ids: list[str]) -> int:
        with self._lock:
            removed = self._remove([i for i in ids if i in self._ids])
            self._commit()
            return removed

    def clear(self) -> None:
        with self._lock:
            self._reset()
            self._commit()

    def _remove(self, ids: list[str]) -> int:
        if not ids:
            return 0
        int_ids = np.array([self._ids.pop(i) for i in ids], dtype=np.int64)
        for int_id in int_ids.tolist():
            del self._docs[int_id]
        return int(self._index.remove_ids(int_ids))

    # Persistence: one snapshot file (FAISS bytes + payloads), written beside and renamed over the old
    # one, so a crash leaves either the previous or the new state, never an index without its texts.
    SNAPSHOT = "index.npz"

    def _commit(self) -> None:
        try:
            self._persist()
        except Exception:
            # the caller reports an error: memory must not keep what the disk did not
            self._reset()
            if (self.path / self.SNAPSHOT).is_file():
                self._load()
            raise

    def _persist(self) -> None:
        if not self.path:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        state = {"next_id": self._next_id, "docs": [[k, d.id, d.text, d.metadata] for k, d in self._docs.items()]}
        tmp = self.path / (self.SNAPSHOT + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, faiss=faiss.serialize_index(self._index),
                     state=np.frombuffer(json.dumps(state).encode(), dtype=np.uint8))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / self.SNAPSHOT)

    def _load(self) -> None:
        with np.load(self.path / self.SNAPSHOT, allow_pickle=False) as snapshot:
            index = faiss.deserialize_index(snapshot["faiss"])
            state = json.loads(snapshot["state"].tobytes())
        if index.d != self.dim:
            raise ValueError(f"index at {self.path} has dimension {index.d}, the model {self.dim}")
        docs = {k: Document(i, t, m) for k, i, t, m in state["docs"]}
        if index.ntotal != len(docs):
            raise ValueError(f"index at {self.path} holds {index.ntotal} vectors for {len(docs)} documents")
        self._index = index
        self._next_id = state["next_id"]
        self._docs = docs
        self._ids = {d.id: k for k, d in docs.items()}
