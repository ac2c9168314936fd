"""Drive the service from the ecosystem's own harnesses.

- `BeirServiceModel`: the model interface of BEIR's DenseRetrievalExactSearch
  (`encode_queries(queries, batch_size, **kw)`, `encode_corpus(corpus, batch_size, **kw)`), e.g.
  `EvaluateRetrieval(DRES(BeirServiceModel(url), batch_size=128), score_function="cos_sim")`.
- `MtebServiceEncoder`: MTEB's encoder interface (`encode(sentences, **kwargs) -> np.ndarray`).
Both embed through POST /embed, chunked to the service's request limit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evaluation.beir import BeirSet
from evaluation.embedders import ServiceEmbedder


class BeirServiceModel:
    def __init__(self, url: str, chunk: int = 128):
        self._embedder = ServiceEmbedder(url, chunk)

    def encode_queries(self, queries: list[str], batch_size: int = 128, **kwargs: Any) -> np.ndarray:
        return self._embedder.encode(list(queries))

    def encode_corpus(self, corpus: list[dict[str, str]] | dict[str, list], batch_size: int = 128,
                      **kwargs: Any) -> np.ndarray:
        # BEIR passes a list of {"title", "text"} dicts (newer versions: a dict of lists).
        if isinstance(corpus, dict):
            corpus = [{"title": t, "text": x} for t, x in zip(corpus.get("title", [""] * len(corpus["text"])),
                                                               corpus["text"])]
        return self._embedder.encode([BeirSet.document_text(doc) for doc in corpus])


class MtebServiceEncoder:
    def __init__(self, url: str, chunk: int = 128):
        self._embedder = ServiceEmbedder(url, chunk)
        self.model_card_data = {"model_name": self._embedder.name}

    def encode(self, sentences: list[str], **kwargs: Any) -> np.ndarray:
        return self._embedder.encode(list(sentences))
