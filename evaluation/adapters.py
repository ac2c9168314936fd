"""Drive the service from the ecosystem's own harnesses; both classes embed through POST /embed.

BEIR (its DenseRetrievalExactSearch takes any object with these two methods):

    from beir.retrieval.evaluation import EvaluateRetrieval
    from beir.retrieval.search.dense import DenseRetrievalExactSearch as DRES
    retriever = EvaluateRetrieval(DRES(BeirServiceModel("http://localhost:8080"), batch_size=128),
                                  score_function="cos_sim")
    results = retriever.retrieve(corpus, queries)
    ndcg, _map, recall, precision = retriever.evaluate(qrels, results, retriever.k_values)

MTEB (the encoder interface: `encode` returning [n, dim], `similarity`, `similarity_pairwise`):

    import mteb
    mteb.evaluate(MtebServiceEncoder("http://localhost:8080"), mteb.get_tasks(tasks=["STSBenchmark"]))
    # mteb < 2: mteb.MTEB(tasks=[...]).run(MtebServiceEncoder(url))

The service has no notion of query vs passage prompts: both kinds are embedded the same way, as our
models are trained.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from evaluation.beir import BeirSet
from evaluation.embedders import ServiceEmbedder


class BeirServiceModel:
    """BEIR's dense-model interface: encode_queries(list[str]) and encode_corpus(documents)."""

    def __init__(self, url: str, chunk: int = 128):
        self._embedder = ServiceEmbedder(url, chunk)

    def encode_queries(self, queries: list[str], batch_size: int = 128, **kwargs: Any) -> np.ndarray:
        return self._embedder.encode(list(queries))

    def encode_corpus(self, corpus: list[dict[str, str]] | dict[str, list[str]], batch_size: int = 128,
                      **kwargs: Any) -> np.ndarray:
        """BEIR passes a list of {"title", "text"} dicts (newer versions: a dict of lists)."""
        if isinstance(corpus, dict):
            titles = corpus.get("title") or [""] * len(corpus["text"])
            corpus = [{"title": t, "text": x} for t, x in zip(titles, corpus["text"], strict=True)]
        return self._embedder.encode([BeirSet.document_text(doc) for doc in corpus])


def _texts(inputs: Iterable) -> list[str]:
    """mteb < 2 passes a list of strings; mteb 2 a DataLoader of batches {"text": [...], ...}."""
    if isinstance(inputs, str):
        return [inputs]
    texts: list[str] = []
    for item in inputs:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, dict) and "text" in item:
            texts.extend([item["text"]] if isinstance(item["text"], str) else item["text"])
        else:
            raise TypeError(f"cannot embed {type(item).__name__}: expected text or a batch with a 'text' field")
    return texts


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    x = x[None] if x.ndim == 1 else x
    return x / np.linalg.norm(x, axis=1, keepdims=True).clip(min=1e-12)


class MtebServiceEncoder:
    """MTEB's encoder interface over the service; similarity is cosine, as the models are trained."""

    def __init__(self, url: str, chunk: int = 128):
        self._embedder = ServiceEmbedder(url, chunk)
        self.model_name = self._embedder.name
        self.model_card_data = {"model_name": self.model_name}

    def encode(self, inputs: Iterable, *args: Any, **kwargs: Any) -> np.ndarray:
        return self._embedder.encode(_texts(inputs))

    def similarity(self, embeddings1: np.ndarray, embeddings2: np.ndarray) -> np.ndarray:
        return _unit(embeddings1) @ _unit(embeddings2).T

    def similarity_pairwise(self, embeddings1: np.ndarray, embeddings2: np.ndarray) -> np.ndarray:
        return (_unit(embeddings1) * _unit(embeddings2)).sum(axis=1)
