"""What the routes depend on: the `VectorIndex` interface, its records, and its errors.

Two implementations: `LocalIndex` (FAISS in this process, a write-ahead log on local disk: one
node, one writer) and `MilvusIndex` (a Milvus server or Milvus Lite holds vectors, payloads and
filters: the service stays stateless and scales out). Both pass the same contract tests.

Vectors reaching an index are L2-normalised, so inner product is cosine similarity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

DEFAULT_COLLECTION = "default"
#: what a search ranks by (SearchParams.mode)
SEARCH_MODES = ("dense", "lexical", "sparse", "hybrid")


@dataclass(frozen=True)
class ModelStamp:
    """Which model made a collection's vectors: a name and the graph's sha256."""

    name: str
    sha256: str

    def describe(self) -> str:
        return f"{self.name} (sha256 {self.sha256[:12]})"


@dataclass
class CollectionSpec:
    name: str
    dimension: int
    index_type: str = "Flat"  # a FAISS factory string: Flat, HNSW32, IVF1024,SQ8, IVF1024,PQ48
    model: ModelStamp | None = None  # None: vectors come from the client, never embedded here
    # none | int8 | binary: what the searched structure stores (vectors.py); the floats rescore its candidates
    quantization: str = "none"
    lexical: bool = False  # a BM25 index of the stored texts beside the vectors (lexical.py): mode lexical, hybrid
    # a sparse (SPLADE) vector per chunk beside the dense one (sparse.py): mode sparse, hybrid; the model that
    # makes them and its vocabulary (the sparse vectors' dimension)
    sparse_model: ModelStamp | None = None
    sparse_dimension: int = 0


@dataclass
class CollectionInfo:
    name: str
    dimension: int
    index_type: str
    model: ModelStamp | None
    count: int
    sequence: int  # the last durable write applied to this collection
    ann_ready: bool = True  # False while an ANN structure is untrained or being rebuilt (search is exact then)
    quantization: str = "none"
    lexical: bool = False
    sparse_model: ModelStamp | None = None
    sparse_dimension: int = 0


@dataclass(frozen=True)
class Document:
    """A stored document. A long text is several chunks, each a vector: `chunks` holds their [start, end)
    character spans in `text`, and a write brings one vector per chunk in that order. None: one chunk,
    one vector, for the whole text (what every document was before chunking)."""

    id: str
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    chunks: list[tuple[int, int]] | None = None

    @property
    def rows(self) -> int:
        """The vectors this document has: one per chunk."""
        return 1 if self.chunks is None else len(self.chunks)

    def spans(self) -> list[tuple[int, int]]:
        return [(0, len(self.text))] if self.chunks is None else [(int(a), int(b)) for a, b in self.chunks]


class SparseRows(NamedTuple):
    """Sparse vectors, a row per chunk, as CSR arrays: row i's non-zero dimensions are
    indices[indptr[i]:indptr[i + 1]] (ascending), their values values[indptr[i]:indptr[i + 1]]."""

    indptr: np.ndarray  # int64, rows + 1, from 0
    indices: np.ndarray  # int32
    values: np.ndarray  # float32

    @property
    def rows(self) -> int:
        return len(self.indptr) - 1


def vector_rows(documents: list[Document]) -> int:
    """The rows of the vectors a write of `documents` brings: one per chunk."""
    return sum(d.rows for d in documents)


@dataclass
class Record:
    """A stored document as a read returns it (vector only when asked for)."""

    id: str
    text: str | None = None  # None when the read did not ask for it
    metadata: dict[str, Any] | None = None
    vector: list[float] | None = None  # a chunked document's: its first chunk's
    spans: list[tuple[int, int]] | None = None  # its chunks' spans (scan fills it: re-embedding keeps them)


@dataclass
class Hit(Record):
    """A document a search found: its best chunk's score and span (start, end: character offsets in its
    text); `chunks`, when asked, every chunk of it among the candidates as [start, end, score], best first."""

    score: float = 0.0
    start: int | None = None
    end: int | None = None
    chunks: list[tuple[int, int, float]] | None = None


@dataclass
class WriteResult:
    """What a write made durable: how many documents it touched, and the log's sequence number."""

    count: int
    sequence: int
    total: int  # documents in the collection after the write


@dataclass
class SearchParams:
    k: int = 10
    filter: dict[str, Any] | None = None
    score_threshold: float | None = None
    ef_search: int | None = None  # HNSW
    nprobe: int | None = None  # IVF
    oversample: int | None = None  # quantized: candidates rescored per hit (None: the index's default)
    with_text: bool = True
    with_metadata: bool = True
    with_vector: bool = False
    with_chunks: bool = False  # each hit lists every chunk of its document among the candidates (Hit.chunks)
    # dense: by the query vectors; lexical: BM25 over the stored texts, by `texts`; sparse: dot product with the
    # stored sparse vectors, by `sparse_queries`; hybrid: the dense ranking and those of the lexical index and the
    # sparse vectors the collection has (`candidates` of each, at least k) fused by reciprocal rank:
    # weight / (rrf_k + rank) summed
    mode: str = "dense"
    texts: list[str] | None = None  # the queries' text (lexical, and hybrid on a lexical collection)
    # the queries' sparse vectors: (indices, values) each (sparse, and hybrid on a collection with sparse vectors)
    sparse_queries: list[tuple[list[int], list[float]]] | None = None
    rrf_k: int = 60
    dense_weight: float = 1.0
    lexical_weight: float = 1.0
    sparse_weight: float = 1.0
    candidates: int | None = None  # None: lexical.DEFAULT_CANDIDATES


class VectorIndex(Protocol):
    """The contract (tests/test_index_contract.py runs it on every implementation):

    - names: collection names match validation.COLLECTION_PATTERN, ids validation.ID_PATTERN,
      metadata passes validation.check_metadata, vectors are (n, dimension), finite: else InvalidRequest.
    - create_collection: CollectionExists unless exist_ok and the existing one has the same dimension (the local
      index then adds or drops the existing one's lexical index to match spec.lexical: SEMBED_INDEX_LEXICAL).
    - upsert: an id already present is replaced (vectors, text and metadata); one call's ids are distinct;
      vectors has one row per chunk (Document.rows), documents in order; a document is all its chunks or none.
      `sparse`: a row per chunk too, given exactly when the collection keeps sparse vectors (sparse_model).
    - get: the records found, in the order asked; unknown ids are left out.
    - delete: by ids (unknown ones ignored) or by filter, exactly one of them; count = documents removed.
    - search: per query, up to k documents by descending score of their best chunk (its span: Hit.start,
      end), only those passing the filter (applied before ranking, so never short when enough documents
      match) and score >= score_threshold;
      text/metadata/vector filled as SearchParams asks, None otherwise. `queries` may be None for
      mode lexical and sparse; a mode the collection cannot search (no lexical index, no sparse vectors) is an
      InvalidRequest.
    - every write returns WriteResult: what it changed, the sequence number now durable, the new total.
    - an unknown collection: CollectionNotFound.
    """

    def create_collection(self, spec: CollectionSpec, exist_ok: bool = False) -> CollectionInfo: ...

    def drop_collection(self, name: str) -> WriteResult: ...

    def list_collections(self) -> list[CollectionInfo]: ...

    def info(self, name: str) -> CollectionInfo: ...

    def upsert(self, name: str, documents: list[Document], vectors: np.ndarray,
               sparse: SparseRows | None = None) -> WriteResult: ...

    def get(self, name: str, ids: list[str], with_vector: bool = False) -> list[Record]: ...

    def delete(self, name: str, ids: list[str] | None = None, filter: dict[str, Any] | None = None) -> WriteResult:
        ...

    def clear(self, name: str) -> WriteResult: ...

    def search(self, name: str, queries: np.ndarray | None, params: SearchParams) -> list[list[Hit]]: ...

    def scan(self, name: str, batch: int = 1000):  # yields lists of Record (with text), for re-embedding
        ...

    def replace_collection(self, spec: CollectionSpec, batches) -> WriteResult:
        """Rebuild `spec.name` from (documents, vectors) batches, switching atomically at the end."""
        ...

    def close(self) -> None: ...


class VectorIndexError(Exception):
    """Base of the index's errors; `status` and `error_type` are what the HTTP layer answers."""

    status = 500
    error_type = "Index"


class CollectionNotFound(VectorIndexError):
    status, error_type = 404, "NotFound"


class CollectionExists(VectorIndexError):
    status, error_type = 409, "Conflict"


class ModelMismatch(VectorIndexError):
    status, error_type = 409, "ModelMismatch"


class InvalidRequest(VectorIndexError):
    status, error_type = 422, "Validation"


class NotDurable(VectorIndexError):
    """The write could not be made durable and was not applied (503: log unavailable, 507: disk full)."""

    status, error_type = 503, "NotDurable"

    def __init__(self, message: str, status: int = 503):
        super().__init__(message)
        self.status = status
