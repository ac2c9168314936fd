"""Re-embed a collection from its stored texts with another model, then switch to it in one step.

Used by POST /admin/collections/{name}/reembed, by a model reload with `reembed`, and from the
command line while the service is stopped (service/offline_reembed.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from service.index.base import (
    CollectionSpec,
    Document,
    InvalidRequest,
    ModelStamp,
    SparseRows,
    VectorIndex,
    WriteResult,
)

Embed = Callable[[list[str]], np.ndarray]
EmbedSparse = Callable[[list[str]], SparseRows]


def reembed(index: VectorIndex, name: str, stamp: ModelStamp, dimension: int, embed: Embed,
            batch: int = 256, embed_sparse: EmbedSparse | None = None,
            sparse_stamp: ModelStamp | None = None) -> WriteResult:
    """Rebuild `name` with `embed`'s vectors of every stored text; writes to it are refused meanwhile and
    searches keep the old vectors until the switch. Chunked documents keep their chunks' spans. A collection
    that keeps sparse vectors gets them again from `embed_sparse`: its sparse model, or a new one stamped
    `sparse_stamp` (its vocabulary must be the same size)."""
    info = index.info(name)
    if info.model is None:
        raise InvalidRequest(f"collection {name!r} holds client vectors, not texts to re-embed")
    if info.sparse_model is not None and embed_sparse is None:
        raise InvalidRequest(f"collection {name!r} keeps sparse vectors of {info.sparse_model.describe()}: "
                             "re-embed it through the service, which serves that model")

    def batches():
        for records in index.scan(name, batch):
            # a chunked document keeps its spans: each chunk's text is embedded again
            documents = [Document(r.id, r.text or "", r.metadata or {}, r.spans) for r in records]
            texts = [d.text[a:b] for d in documents for a, b in d.spans()]
            if embed_sparse is None:
                yield documents, embed(texts)
            else:
                yield documents, embed(texts), embed_sparse(texts)

    spec = CollectionSpec(name, dimension, info.index_type, stamp, info.quantization, info.lexical,
                          sparse_stamp or info.sparse_model, info.sparse_dimension)
    return index.replace_collection(spec, batches())
