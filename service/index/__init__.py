"""The search index: collections of documents and vectors behind the VectorIndex interface."""

from service.index.base import (  # noqa: F401
    DEFAULT_COLLECTION,
    CollectionExists,
    CollectionInfo,
    CollectionNotFound,
    CollectionSpec,
    Document,
    Hit,
    InvalidRequest,
    ModelMismatch,
    ModelStamp,
    NotDurable,
    Record,
    SearchParams,
    VectorIndex,
    VectorIndexError,
    WriteResult,
)


def __getattr__(name: str):
    # FAISS loads only where an index lives (the index process, tests, tools), not in every API process
    if name == "LocalIndex":
        from service.index.local import LocalIndex

        return LocalIndex
    raise AttributeError(name)


def open_configured(settings) -> VectorIndex:
    """The index `settings` (service.settings.Settings) describe, opened in this process."""
    options = {"fsync": settings.index_fsync, "snapshot_every_ops": settings.index_snapshot_every_ops,
               "snapshot_every_s": settings.index_snapshot_every_s, "gpu": settings.index_gpu,
               "float_vectors": settings.index_float_vectors,
               "lexical_rebuild": settings.index_lexical_rebuild} if settings.index_backend == "local" else {}
    options["oversample"] = settings.index_oversample
    return open_index(settings.index_backend, settings.index_location(), uri=settings.milvus_uri, **options)


def open_index(backend: str, path=None, uri: str | None = None, **options) -> VectorIndex:
    """`local` (FAISS + write-ahead log under `path`) or `milvus` (a Milvus server or Milvus Lite file at `uri`)."""
    if backend == "local":
        from service.index.local import LocalIndex

        return LocalIndex(path, **options)
    if backend == "milvus":
        from service.index.milvus import MilvusIndex

        return MilvusIndex(uri or "", **options)
    raise ValueError(f"unknown index backend {backend!r}; use local or milvus")
