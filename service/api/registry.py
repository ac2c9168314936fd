"""The models an API process serves, by name: a tokenizer here and an engine client to the model.

Routes never keep a model: they look one up per request, so replacing the registry's entry (a
reload) moves every following request, tokenizer and engine together, to the new model while the
old engine drains what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, cast

from service.api.client import EngineClient, InProcessEngineClient
from service.ipc.messages import EmbedResult, EngineError, ModelInfo, TokenBatch, WrongModelType
from service.metrics import ApiMetrics, observe_all
from service.tokenization import TextTokenizer, check_texts, check_truncation, from_ids

log = logging.getLogger("sembed.registry")

class ModelNotFound(EngineError):
    pass


@dataclass
class ServedModel:
    """One model as the routes see it: tokenise here, embed in its engine."""

    client: EngineClient
    tokenizer: TextTokenizer
    metrics: ApiMetrics
    auto_truncate: bool = True

    @property
    def info(self) -> ModelInfo:
        return self.client.info

    held: int = 0  # requests inside embed/rerank, tokenising or waiting on the engine
    token: int | None = None  # a staged reload's number at the supervisor

    @property
    def ready(self) -> bool:
        return self.client.ready

    async def embed(self, inputs: list[str] | list[list[int]], *, normalize: bool = True, truncate: bool | None = None,
                    truncation_direction: str = "right", timeout_s: float | None = None) -> EmbedResult:
        """Texts, or inputs already tokenised as the model's own token ids (taken as they are)."""
        if self.info.is_cross_encoder:
            raise WrongModelType(f"model {self.info.model} is a reranker (cross-encoder): it scores (query, text) "
                                 "pairs at /rerank and gives no embeddings")
        truncate = self.auto_truncate if truncate is None else truncate
        with self._holding():
            start = time.perf_counter()
            if inputs and not isinstance(inputs[0], str):
                batch = from_ids(inputs, self.info.max_seq_length, self.info.vocab_size, truncate)
            else:
                check_texts(cast(list[str], inputs))  # inputs[0] is a str: pydantic's lists hold one kind
                batch, original = await self._tokenize(self.tokenizer.encode, sum(map(len, inputs)), inputs,
                                                       truncation_direction)
                if not truncate:
                    check_truncation(original, self.info.max_seq_length)
            return await self._infer(batch, normalize, timeout_s, time.perf_counter() - start)

    async def rerank(self, query: str, texts: list[str], *, truncate: bool | None = None,
                     truncation_direction: str = "right", timeout_s: float | None = None) -> EmbedResult:
        """A cross-encoder's score of each (query, text) pair, in `vectors[:, 0]`."""
        if not self.info.is_cross_encoder:
            raise WrongModelType(f"model {self.info.model} is not a re-ranker (cross-encoder)")
        truncate = self.auto_truncate if truncate is None else truncate
        with self._holding():
            start = time.perf_counter()
            check_texts([query], "query")
            check_texts(texts, "texts")
            pairs = [(query, text) for text in texts]
            batch, original = await self._tokenize(self.tokenizer.encode_pairs, (len(query) + 1) * len(texts) +
                                                   sum(map(len, texts)), pairs, truncation_direction)
            if not truncate:
                check_truncation(original, self.info.max_seq_length, "texts[{}] with the query")
            return await self._infer(batch, False, timeout_s, time.perf_counter() - start)

    @contextlib.contextmanager
    def _holding(self):
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1

    def token_details(self, texts: list[str], add_special_tokens: bool = True) -> list[list[dict]]:
        check_texts(texts)
        return self.tokenizer.token_details(texts, add_special_tokens)

    async def _tokenize(self, encode, chars: int, inputs, direction: str):
        if chars <= self.tokenizer.inline_chars:
            return encode(inputs, direction)
        return await asyncio.to_thread(encode, inputs, direction)

    async def _infer(self, batch: TokenBatch, normalize: bool, timeout_s: float | None,
                     tokenization_s: float) -> EmbedResult:
        self.metrics.tokenization_seconds.observe(tokenization_s)
        observe_all(self.metrics.input_tokens, batch.lengths)
        result = await self.client.embed(batch, normalize=normalize, timeout_s=timeout_s)
        result.tokenization_s = tokenization_s
        return result


class ModelRegistry:
    def __init__(self, metrics: ApiMetrics | None = None, auto_truncate: bool = True) -> None:
        self.metrics = metrics or ApiMetrics()
        self.auto_truncate = auto_truncate
        self._models: dict[str, ServedModel] = {}
        self.default: str | None = None

    def served(self, client: EngineClient, tokenizer: TextTokenizer) -> ServedModel:
        return ServedModel(client, tokenizer, self.metrics, self.auto_truncate)

    def add(self, name: str, client: EngineClient, tokenizer: TextTokenizer) -> ServedModel:
        if name in self._models:
            raise ValueError(f"two models named {name!r}")
        model = self._models[name] = self.served(client, tokenizer)
        self.default = self.default or name
        return model

    def add_in_process(self, name: str, engine: Any, tokenizer: TextTokenizer | None = None) -> ServedModel:
        """A service.engine.core.Engine running in this process (tests, tools; the API side never imports the
        engine's package), with its backend's tokenizer unless given."""
        if not engine.ready:
            engine.start()
        self.metrics.include(engine.metrics.registry)
        return self.add(name, InProcessEngineClient(engine), tokenizer or engine.backend.tokenizer)

    def replace(self, name: str, model: ServedModel) -> ServedModel:
        """Put another model in `name`'s place and return the old one, still serving what it holds: every later
        request goes to the new one. `retire` the old one."""
        old = self.get(name)
        self._models[name] = model
        return old

    def resolve(self, name: str | None = None) -> str:
        """`name`, or the default model's name when none is given; ModelNotFound if no such model is served."""
        return self.name_of(self.get(name or None))

    def get(self, name: str | None = None) -> ServedModel:
        if name is None:
            name = self.default
        model = self._models.get(name) if name is not None else None
        if model is None:
            raise ModelNotFound(f"no model named {name!r}; this service has {self.names()}")
        return model

    def name_of(self, model: ServedModel) -> str:
        return next(n for n, m in self._models.items() if m is model)

    def names(self) -> list[str]:
        return list(self._models)

    @property
    def ready(self) -> bool:
        return bool(self._models) and all(m.ready for m in self._models.values())

    async def close(self) -> None:
        for model in self._models.values():
            await model.client.close()


async def retire(model: ServedModel, grace_s: float) -> None:
    """Close a replaced model's engine client once the requests it holds are answered (or the grace is over)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while (model.held or getattr(model.client, "in_flight", 0)) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    await model.client.close()
