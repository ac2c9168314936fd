"""The search index: collections of documents and vectors behind the VectorIndex interface."""

from service.index.base import (  # noqa: F401
    DEFAULT_COLLECTION,
    CollectionExists,
    CollectionInfo,
    CollectionNotFound,
    CollectionSpec,
    Document,
    Hit,
    IndexError_,
    InvalidRequest,
    ModelMismatch,
    ModelStamp,
    NotDurable,
    Record,
    SearchParams,
    VectorIndex,
    WriteResult,
)
from service.index.local import LocalIndex  # noqa: F401


def open_index(backend: str, path=None, uri: str | None = None, **options) -> VectorIndex:
    """`local` (FAISS + write-ahead log under `path`) or `milvus` (a Milvus server or Milvus Lite file at `uri`)."""
    if backend == "local":
        return LocalIndex(path, **options)
    if backend == "milvus":
        from service.index.milvus import MilvusIndex

        return MilvusIndex(uri or "")
    raise ValueError(f"unknown index backend {backend!r}; use local or milvus")
