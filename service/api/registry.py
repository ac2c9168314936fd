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
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import numpy as np

from service.api.cache import VectorCache, scope_of
from service.api.client import EngineClient, InProcessEngineClient
from service.ipc.messages import EmbedResult, EngineError, InvalidInput, ModelInfo, TokenBatch, WrongModelType
from service.metrics import ApiMetrics
from service.tokenization import TextTokenizer, check_texts, check_truncation, from_ids

log = logging.getLogger("sembed.registry")

class ModelNotFound(EngineError):
    pass


class PromptRefused(InvalidInput):
    """A prompt the request cannot have: `param` is the field to blame, `detail` what the model offers."""

    def __init__(self, message: str, param: str, detail: Any = None):
        super().__init__(message)
        self.param, self.detail = param, detail


class Prompt(NamedTuple):
    text: str  # put before each input; "": none
    param: str = "prompt_name"  # the request field it came from: prompt_name (or the default), or instruction
    label: str = ""  # how a message names it


NO_PROMPT = Prompt("")
#: a prompt's token count is kept per prompt text; bounded, as instructions are free-form
_PROMPT_CACHE = 1024


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
    name: str = ""  # the name requests give it (`model`); set by the registry
    _prompt_tokens: dict[str, int] = field(default_factory=dict, repr=False)  # prompt text → its token count
    cache: VectorCache = field(default_factory=lambda: VectorCache(0), repr=False)  # the registry's; default: off

    @property
    def ready(self) -> bool:
        return self.client.ready

    async def embed(self, inputs: list[str] | list[list[int]], *, normalize: bool = True, truncate: bool | None = None,
                    truncation_direction: str = "right", timeout_s: float | None = None,
                    prompt_name: str | None = None, instruction: str | None = None) -> EmbedResult:
        """Texts, each after its prompt (`prompt`), or inputs already tokenised as the model's own token ids
        (taken as they are: no prompt applies to them, and naming one is refused)."""
        if self.info.is_sparse and normalize:  # as TEI: a SPLADE vector is served whole, never normalised
            raise self.wrong_kind("`normalize` is not available for SPLADE models")
        if not (self.info.gives_embeddings or self.info.is_sparse):
            raise self.wrong_kind("Model is not an embedding model")
        truncate = self.auto_truncate if truncate is None else truncate
        with self._holding():
            start = time.perf_counter()
            if inputs and not isinstance(inputs[0], str):
                if prompt_name is not None or instruction is not None:
                    raise PromptRefused("a prompt is text put before text: inputs given as token ids take none "
                                        "(send text, or put the prompt's ids in front yourself)",
                                        "prompt_name" if prompt_name is not None else "instruction")
                batch = from_ids(inputs, self.info.max_seq_length, self.info.vocab_size, truncate)
                return await self._infer(batch, normalize, timeout_s, time.perf_counter() - start)
            texts = cast(list[str], inputs)  # inputs[0] is a str: pydantic's lists hold one kind
            check_texts(texts)
            prompt = self.prompt(prompt_name, instruction)

            async def embed_texts(some: list[str], positions: list[int] | None = None):
                """`some` of the texts (at `positions` of the request: what a refusal names) through the engine."""
                if prompt.text:
                    await self._check_room(prompt)
                    some = [prompt.text + text for text in some]
                batch, original = await self._tokenize(self.tokenizer.encode, sum(map(len, some)), some,
                                                       truncation_direction)
                if not truncate:
                    if positions is not None:  # a refusal names the text's index in the request
                        full = np.zeros(len(texts), original.dtype)
                        full[positions] = original
                        original = full
                    check_truncation(original, self.info.max_seq_length,
                                     "inputs[{}] with its prompt" if prompt.text else "inputs[{}]")
                result = await self._infer(batch, normalize, timeout_s, time.perf_counter() - start)
                return result, batch.lengths

            if not (self.cache.on and texts and self.name):  # a staged model (no name yet) serves no requests
                return (await embed_texts(texts))[0]
            scope = scope_of(self.name, self.info, prompt.text, truncate, truncation_direction, normalize)
            return await self.cache.embed(scope, texts, embed_texts)

    def prompt(self, name: str | None = None, instruction: str | None = None) -> Prompt:
        """The text put before each input, chosen as sentence-transformers' encode(prompt=, prompt_name=)
        chooses it: `instruction` as given, else the model's prompt `name`, else its default prompt (none if it
        has none)."""
        if instruction is not None:
            if name is not None:  # the request schemas refuse this first
                raise PromptRefused("give prompt_name or instruction, not both", "instruction")
            check_texts([instruction], "instruction")
            return Prompt(instruction, "instruction", "the instruction")
        prompts: dict[str, str] = self.info.manifest.get("prompts") or {}
        if name is None:
            name = self.info.manifest.get("default_prompt_name")
            if name is None or name not in prompts:
                return NO_PROMPT
            return Prompt(prompts[name], "prompt_name", f"the default prompt {name!r}")
        if name not in prompts:
            has = ", ".join(map(repr, sorted(prompts))) or "none"
            raise PromptRefused(f"model {self.info.model} has no prompt named {name!r}; its prompts: {has}",
                                "prompt_name", {"prompts": sorted(prompts)})
        return Prompt(prompts[name], "prompt_name", f"prompt {name!r}")

    async def _check_room(self, prompt: Prompt) -> None:
        """Refuse a prompt that, with the special tokens, fills the model's window: no text would be left."""
        n = self._prompt_tokens.get(prompt.text)
        if n is None:
            _, original = await self._tokenize(self.tokenizer.encode, len(prompt.text), [prompt.text], "right")
            n = int(original[0])
            if len(self._prompt_tokens) >= _PROMPT_CACHE:
                self._prompt_tokens.clear()
            self._prompt_tokens[prompt.text] = n
        limit = self.info.max_seq_length
        if n >= limit:
            shown = prompt.text if len(prompt.text) <= 60 else prompt.text[:57] + "..."
            raise PromptRefused(f"{prompt.label} ({shown!r}) takes {n} tokens with the special tokens; the model "
                                f"takes at most {limit}: no room is left for the text", prompt.param)

    async def rerank(self, query: str, texts: list[str], *, truncate: bool | None = None,
                     truncation_direction: str = "right", timeout_s: float | None = None) -> EmbedResult:
        """A cross-encoder's score of each (query, text) pair, in `vectors[:, 0]`."""
        if not self.info.is_cross_encoder:
            raise self.wrong_kind("model is not a re-ranker model")
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

    async def classify(self, inputs: list[str | tuple[str, str]], *, truncate: bool | None = None,
                       truncation_direction: str = "right", timeout_s: float | None = None) -> EmbedResult:
        """A classifier's logit of each label for each text or (text, text) pair, [n, labels], in order; a reranker's
        one logit (TEI's /predict takes either: a reranker is a one-label classifier)."""
        if not (self.info.is_classifier or self.info.is_cross_encoder):
            raise self.wrong_kind("Model is not a classifier model")
        truncate = self.auto_truncate if truncate is None else truncate
        with self._holding():
            start = time.perf_counter()
            singles = [i for i, x in enumerate(inputs) if isinstance(x, str)]
            pairs = [i for i, x in enumerate(inputs) if not isinstance(x, str)]
            for i in singles:
                check_texts([cast(str, inputs[i])], f"inputs[{i}]")
            for i in pairs:
                check_texts(list(inputs[i]), f"inputs[{i}]")
            chars = sum(len(x) if isinstance(x, str) else len(x[0]) + len(x[1]) for x in inputs)
            parts, originals = [], []
            for rows, encode in ((singles, self.tokenizer.encode), (pairs, self.tokenizer.encode_pairs)):
                if rows:
                    batch, original = await self._tokenize(encode, chars, [inputs[i] for i in rows],
                                                           truncation_direction)
                    parts.append(batch)
                    originals.append(original)
            order = np.argsort(np.array(singles + pairs), kind="stable")  # back to the inputs' order
            batch = TokenBatch.concat(parts).take(order)
            if not truncate:
                check_truncation(np.concatenate(originals)[order], self.info.max_seq_length)
            return await self._infer(batch, False, timeout_s, time.perf_counter() - start)

    def wrong_kind(self, tei_says: str) -> WrongModelType:
        """TEI's 424 for a route this kind of model cannot answer: TEI's own sentence first (what its clients
        match), then what this model is and where it answers."""
        return WrongModelType(f"{tei_says}: model {self.name or self.info.model!r} is {self.info.described}")

    @contextlib.contextmanager
    def _holding(self):
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1

    def token_details(self, texts: list[str], add_special_tokens: bool = True, prompt_name: str | None = None,
                      instruction: str | None = None) -> list[list[dict]]:
        """The tokens of each text after its prompt, as embed tokenises it (spans count from the prompt's start)."""
        check_texts(texts)
        prompt = self.prompt(prompt_name, instruction).text
        return self.tokenizer.token_details([prompt + text for text in texts] if prompt else texts, add_special_tokens)

    def decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """Each sequence of the model's token ids as text; an id outside the vocabulary is refused, named."""
        vocab = self.info.vocab_size or self.tokenizer.vocab_size
        for i, row in enumerate(ids):
            bad = next((t for t in row if t < 0 or (vocab is not None and t >= vocab)), None)
            if bad is not None:
                raise InvalidInput(f"ids[{i}] holds {bad}, outside the model's vocabulary of {vocab}")
        return self.tokenizer.decode(ids, skip_special_tokens)

    async def embed_sparse(self, texts: list[str], *, truncate: bool | None = None, truncation_direction: str = "right",
                           timeout_s: float | None = None, prompt_name: str | None = None,
                           ) -> tuple[list[SparseVector], EmbedResult]:
        """A sparse (SPLADE) model's vector of each text as TEI's /embed_sparse answers it: its non-zero dimensions
        (indices ascending, values float32), no more than the model's max_active_dims (its largest values, as
        SparseEncoder.encode keeps them)."""
        if not self.info.is_sparse:
            raise self.wrong_kind("Model is not an embedding model with SPLADE pooling")
        with self._holding():
            start = time.perf_counter()
            batch = await self._text_batch(texts, truncate, truncation_direction, prompt_name)
            result = await self._infer(batch, False, timeout_s, time.perf_counter() - start)
        return sparsify(result.vectors, self.info.manifest.get("max_active_dims")), result

    async def embed_all(self, texts: list[str], *, truncate: bool | None = None, truncation_direction: str = "right",
                        timeout_s: float | None = None, prompt_name: str | None = None,
                        ) -> tuple[list[np.ndarray], EmbedResult]:
        """Every token's last hidden state of each text, special tokens included, [tokens, hidden] per text (TEI's
        /embed_all: the transformer's raw output, neither pooled nor normalised). An export whose graph has no token
        output (made before it existed, or a sparse, reranker or classifier model) is refused, saying why."""
        if not self.info.token_dimension:
            raise WrongModelType(self.info.token_refusal)
        with self._holding():
            start = time.perf_counter()
            batch = await self._text_batch(texts, truncate, truncation_direction, prompt_name)
            tokenization_s = time.perf_counter() - start
            self.metrics.tokenization_seconds.observe(tokenization_s)
            self.metrics.input_tokens.observe_all(batch.lengths)
            result = await self.client.embed(batch, timeout_s=timeout_s, tokens=True)
            result.tokenization_s = tokenization_s
        offsets = batch.offsets
        return [result.vectors[offsets[i]:offsets[i + 1]] for i in range(len(batch))], result

    async def _text_batch(self, texts: list[str], truncate: bool | None, direction: str,
                          prompt_name: str | None) -> TokenBatch:
        """Texts after their prompt, tokenised as /embed tokenises them (too long: truncated, or refused
        without `truncate`)."""
        truncate = self.auto_truncate if truncate is None else truncate
        empty = next((i for i, text in enumerate(texts) if not text), None)
        if empty is not None:  # as TEI answers: 422, the input named
            raise InvalidInput(f"inputs[{empty}] is empty: every input needs text")
        check_texts(texts)
        prompt = self.prompt(prompt_name)
        if prompt.text:
            await self._check_room(prompt)
            texts = [prompt.text + text for text in texts]
        batch, original = await self._tokenize(self.tokenizer.encode, sum(map(len, texts)), texts, direction)
        if not truncate:
            check_truncation(original, self.info.max_seq_length,
                             "inputs[{}] with its prompt" if prompt.text else "inputs[{}]")
        return batch

    async def _tokenize(self, encode, chars: int, inputs, direction: str):
        if chars <= self.tokenizer.inline_chars:
            return encode(inputs, direction)
        return await asyncio.to_thread(encode, inputs, direction)

    async def _infer(self, batch: TokenBatch, normalize: bool, timeout_s: float | None,
                     tokenization_s: float) -> EmbedResult:
        self.metrics.tokenization_seconds.observe(tokenization_s)
        self.metrics.input_tokens.observe_all(batch.lengths)
        result = await self.client.embed(batch, normalize=normalize, timeout_s=timeout_s)
        result.tokenization_s = tokenization_s
        result.row_tokens = batch.lengths
        return result


class SparseVector(NamedTuple):
    """One text's non-zero dimensions: indices ascending, and their values."""

    indices: np.ndarray  # int64
    values: np.ndarray  # float32


def sparsify(vectors: np.ndarray, max_active_dims: int | None = None) -> list[SparseVector]:
    """Each row's non-zero dimensions (TEI drops the zeros), at most `max_active_dims` of them: the largest in
    absolute value, as sentence-transformers' select_max_active_dims keeps them."""
    if max_active_dims is not None and max_active_dims < vectors.shape[1]:
        top = np.argpartition(-np.abs(vectors), max_active_dims - 1, axis=1)[:, :max_active_dims]
        kept = np.zeros_like(vectors)
        np.put_along_axis(kept, top, np.take_along_axis(vectors, top, axis=1), axis=1)
        vectors = kept
    rows, cols = np.nonzero(vectors != 0)  # numpy finds the non-zeros of a boolean array faster than of floats
    values = vectors[rows, cols]
    bounds = np.searchsorted(rows, np.arange(len(vectors) + 1))
    return [SparseVector(cols[a:b], values[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


class ModelRegistry:
    def __init__(self, metrics: ApiMetrics | None = None, auto_truncate: bool = True, cache_mb: float = 0) -> None:
        self.metrics = metrics or ApiMetrics()
        self.auto_truncate = auto_truncate
        self.cache = VectorCache(int(cache_mb * 2**20), self.metrics)  # every model's text vectors (0 MB: off)
        self._models: dict[str, ServedModel] = {}
        self.default: str | None = None

    def served(self, client: EngineClient, tokenizer: TextTokenizer) -> ServedModel:
        return ServedModel(client, tokenizer, self.metrics, self.auto_truncate, cache=self.cache)

    def add(self, name: str, client: EngineClient, tokenizer: TextTokenizer) -> ServedModel:
        if name in self._models:
            raise ValueError(f"two models named {name!r}")
        model = self._models[name] = self.served(client, tokenizer)
        model.name = name
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
        model.name = name
        self.cache.drop(name)  # the old graph's vectors (retire drops what its last requests add)
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
    while (model.held or model.client.in_flight) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    model.cache.drop(model.name)
    await model.client.close()
