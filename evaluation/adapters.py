"""Drive the service from the ecosystem's own harnesses; both classes embed through POST /embed.

BEIR (its DenseRetrievalExactSearch takes any object with these two methods):

    from beir.retrieval.evaluation import EvaluateRetrieval
    from beir.retrieval.search.dense import DenseRetrievalExactSearch as DRES
    retriever = EvaluateRetrieval(DRES(BeirServiceModel("http://localhost:8080"), batch_size=128),
                                  score_function="cos_sim")
    results = retriever.retrieve(corpus, queries)
    ndcg, _map, recall, precision = retriever.evaluate(qrels, results, retriever.k_values)

MTEB 2 (its encoder protocol: `encode` over a DataLoader of batches returning [n, dim], `similarity`,
`similarity_pairwise`, and `mteb_model_meta`, built from the service's /info):

    import mteb
    mteb.evaluate(MtebServiceEncoder("http://localhost:8080"), mteb.get_task("STSBenchmark"),
                  cache=mteb.ResultCache("results/mteb"))
    # mteb < 2: mteb.MTEB(tasks=[...]).run(MtebServiceEncoder(url))

mteb's own `mteb.models.OpenAIAPIEncodeWrapper` works too, through /v1/models and /v1/embeddings (the
MTEB block of docs/evaluation.md has both, as tests/test_mteb.py runs them).

The service has no notion of query vs passage prompts: both kinds are embedded the same way, as our
models are trained.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from core.beir import BeirSet
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


def mteb_model_meta(info: dict, url: str) -> Any:
    """An `mteb.models.ModelMeta` for the served model, from GET /info: its name under `sembed/` (mteb wants
    "organization/name"), the served graph's sha256 as the revision (with the dtype when it is not float32),
    embedding size, max tokens; cosine similarity, no instructions, as our models are trained."""
    from mteb.models import ModelMeta

    manifest = info.get("manifest", {})
    name = manifest.get("name") or info.get("model_id") or url
    revision = info.get("model_sha") or manifest.get("onnx_sha256") or "unknown"
    if info.get("model_dtype", "float32") != "float32":
        revision = f"{revision}-{info['model_dtype']}"
    base = manifest.get("base_model")
    return ModelMeta(
        loader=None, name=name if "/" in name else f"sembed/{name}", revision=revision,
        release_date=None, languages=None, n_parameters=None, memory_usage_mb=None,
        max_tokens=info.get("max_input_length") or manifest.get("max_seq_length"),
        embed_dim=manifest.get("dimension"), license=None, open_weights=None, public_training_code=None,
        public_training_data=None, framework=["ONNX", "API"], reference=None, similarity_fn_name="cosine",
        use_instructions=False, training_datasets=None, adapted_from=base if base and base != name else None,
        modalities=["text"], model_type=["dense"],
    )


class MtebServiceEncoder:
    """MTEB's encoder interface over the service (mteb 2's EncoderProtocol, and mteb < 2's `encode(list)`);
    similarity is cosine, as the models are trained."""

    def __init__(self, url: str, chunk: int = 128):
        self._embedder = ServiceEmbedder(url, chunk)
        self.url = url
        self.model_name = self._embedder.name
        self.model_card_data = {"model_name": self.model_name}  # mteb < 2 names its results folder from it
        self._meta = None

    @property
    def mteb_model_meta(self) -> Any:
        """mteb 2 names the results and the cache from it; mteb is imported only when it asks."""
        if self._meta is None:
            self._meta = mteb_model_meta(self._embedder.client.info(), self.url)
        return self._meta

    def encode(self, inputs: Iterable, *, task_metadata: Any = None, hf_split: str | None = None,
               hf_subset: str | None = None, prompt_type: Any = None, **kwargs: Any) -> np.ndarray:
        """Texts (mteb < 2) or a DataLoader of {"text": [...]} batches (mteb 2) → [n, dim] unit vectors.
        Queries and documents are embedded alike: `prompt_type` and the task are not used."""
        return self._embedder.encode(_texts(inputs))

    def similarity(self, embeddings1: np.ndarray, embeddings2: np.ndarray) -> np.ndarray:
        return _unit(embeddings1) @ _unit(embeddings2).T

    def similarity_pairwise(self, embeddings1: np.ndarray, embeddings2: np.ndarray) -> np.ndarray:
        return (_unit(embeddings1) * _unit(embeddings2)).sum(axis=1)
