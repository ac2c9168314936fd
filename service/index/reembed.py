"""Re-embed a collection from its stored texts with another model, then switch to it in one step.

Used by POST /admin/collections/{name}/reembed, by a model reload with `reembed`, and from the
command line while the service is stopped (service/offline_reembed.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from service.index.base import CollectionSpec, Document, InvalidRequest, ModelStamp, VectorIndex, WriteResult

Embed = Callable[[list[str]], np.ndarray]


def reembed(index: VectorIndex, name: str, stamp: ModelStamp, dimension: int, embed: Embed,
            batch: int = 256) -> WriteResult:
    """Rebuild `name` with `embed`'s vectors of every stored text; writes to it are refused meanwhile and
    searches keep the old vectors until the switch. Chunked documents keep their chunks' spans."""
    info = index.info(name)
    if info.model is None:
        raise InvalidRequest(f"collection {name!r} holds client vectors, not texts to re-embed")

    def batches():
        for records in index.scan(name, batch):
            # a chunked document keeps its spans: each chunk's text is embedded again
            documents = [Document(r.id, r.text or "", r.metadata or {}, r.spans) for r in records]
            yield documents, embed([d.text[a:b] for d in documents for a, b in d.spans()])

    return index.replace_collection(CollectionSpec(name, dimension, info.index_type, stamp, info.quantization,
                                                   info.lexical), batches())
