"""The vector cache (service/api/cache.py): what its key holds, its bound in bytes, eviction, reload, metrics; and
the API over a real ONNX export answering repeated texts from it, bit for bit, in the request's order."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import tracemalloc

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.api.cache import VectorCache, scope_of
from service.api.registry import ModelRegistry, retire
from service.engine.backends.fake import FakeBackend
from service.engine.core import Engine
from service.ipc.messages import EmbedResult, InputTooLong
from service.settings import Settings

PROMPTS = {"query": "query :", "doc": "passage :"}


def fake_registry(cache_mb: float = 1, max_seq_length: int = 16, **models: FakeBackend):
    registry = ModelRegistry(cache_mb=cache_mb)
    for name, backend in (models or {"main": FakeBackend(name="v1", max_seq_length=max_seq_length)}).items():
        backend.info.manifest["prompts"] = PROMPTS
        registry.add_in_process(name, Engine(backend))
    return registry


def embedded(registry, name: str = "main") -> int:
    """Rows the model's engine has run, all passes together."""
    return sum(map(len, registry.get(name).client.engine.backend.passes))


@pytest.fixture
def registry():
    registry = fake_registry()
    yield registry
    asyncio.run(registry.close())


def test_a_repeated_text_is_answered_from_the_cache_with_the_same_bits(registry):
    served = registry.get()
    first = asyncio.run(served.embed(["a b", "c d e"]))
    assert embedded(registry) == 2
    again = asyncio.run(served.embed(["a b", "c d e"]))
    assert embedded(registry) == 2  # no pass ran
    assert again.vectors.tobytes() == first.vectors.tobytes() and again.vectors.dtype == np.float32
    assert again.prompt_tokens == first.prompt_tokens and again.vectors.flags.writeable


@pytest.mark.parametrize("change", [{"inputs": ["a c"]}, {"prompt_name": "query"}, {"instruction": "find :"},
                                    {"truncate": False}, {"truncation_direction": "left"}, {"normalize": False}],
                         ids=lambda c: next(iter(c)))
def test_each_request_option_that_makes_a_vector_is_in_the_key(registry, change):
    served = registry.get()
    base = {"inputs": ["a b"], "prompt_name": None, "instruction": None, "truncate": True,
            "truncation_direction": "right", "normalize": True}
    asyncio.run(served.embed(**base))
    asyncio.run(served.embed(**{**base, "prompt_name": "doc"}))  # the other prompt is not this one's either
    before = embedded(registry)
    changed = asyncio.run(served.embed(**{**base, **change}))
    assert embedded(registry) == before + 1  # a miss: the engine embedded it
    again = asyncio.run(served.embed(**{**base, **change}))
    assert embedded(registry) == before + 1 and again.vectors.tobytes() == changed.vectors.tobytes()


def rows_for(texts: list[str]) -> np.ndarray:
    """A distinct, reproducible vector per text (what the engine would give)."""
    return np.stack([np.random.default_rng(sum(map(ord, t))).standard_normal(8) for t in texts]).astype(np.float32)


class Engine_:
    """What VectorCache.embed calls for the texts it lacks: counts the texts it is asked for."""

    def __init__(self):
        self.asked: list[list[str]] = []

    async def __call__(self, texts: list[str], _positions: list[int]):
        self.asked.append(list(texts))
        return EmbedResult(rows_for(texts), 3 * len(texts), 0.0, 0.0), np.full(len(texts), 3)


def test_the_models_identity_is_in_the_key(registry):
    info = registry.get().info
    base = scope_of("main", info, "", True, "right", True)
    cache, engine = VectorCache(1 << 20), Engine_()
    asyncio.run(cache.embed(base, ["t"], engine))
    asyncio.run(cache.embed(base, ["t"], engine))
    assert engine.asked == [["t"]]
    others = [scope_of("other", info, "", True, "right", True)] + [
        scope_of("main", dataclasses.replace(info, **{field: value}), "", True, "right", True)
        for field, value in (("graph_sha256", "0" * 64), ("variant", "int8"), ("variant", "fp16"),
                             ("device", "cuda"), ("model", "v2"))]
    for other in others:
        asyncio.run(cache.embed(other, ["t"], engine))
    assert len(engine.asked) == 1 + len(others) and len(cache) == 1 + len(others)


def test_partial_hits_send_only_the_missing_texts_once_and_keep_the_order(registry):
    served = registry.get()
    plain = fake_registry(cache_mb=0)
    try:
        asyncio.run(served.embed(["a", "b"]))
        before = embedded(registry)
        texts = ["c", "a", "d d", "b", "c"]
        mixed = asyncio.run(served.embed(texts))
        assert embedded(registry) == before + 2  # c and d d, once each
        expected = asyncio.run(plain.get().embed(texts))
        assert mixed.vectors.tobytes() == expected.vectors.tobytes()
        assert mixed.prompt_tokens == expected.prompt_tokens
    finally:
        asyncio.run(plain.close())


def test_a_refusal_names_the_texts_place_in_the_request(registry):
    served = registry.get()
    asyncio.run(served.embed(["a b", "c"], truncate=False))
    with pytest.raises(InputTooLong, match=r"^inputs\[2\] has"):
        asyncio.run(served.embed(["a b", "c", " ".join(["w"] * 30)], truncate=False))


def test_the_bound_holds_in_bytes_and_the_least_recently_used_go_first():
    scope = scope_of("m", FakeBackend().info, "", True, "right", True)
    cache, engine = VectorCache(20_000), Engine_()
    asyncio.run(cache.embed(scope, ["keep", "old"], engine))
    for i in range(200):
        asyncio.run(cache.embed(scope, [f"text {i}"], engine))
        asyncio.run(cache.embed(scope, ["keep"], engine))  # used again and again: stays
        assert cache.nbytes <= cache.max_bytes
    assert 20 < len(cache) < 200 and engine.asked.count(["keep"]) == 0
    asked = len(engine.asked)
    asyncio.run(cache.embed(scope, ["keep", "text 199", "old"], engine))
    assert engine.asked[asked:] == [["old"]]  # evicted long ago; the recent ones are held
    # an entry larger than the whole bound is answered, not kept
    tiny = VectorCache(100)
    assert asyncio.run(tiny.embed(scope, ["t"], engine)).vectors.shape == (1, 8) and len(tiny) == 0


def test_the_bound_counts_what_the_entries_really_take():
    """Traced memory of a full cache of 384-dimension vectors: within the bound, and most of it used."""
    scope = scope_of("m", FakeBackend().info, "", True, "right", True)
    cache = VectorCache(2_000_000)

    async def engine(texts, _positions):
        return EmbedResult(np.ones((len(texts), 384), np.float32), len(texts), 0.0, 0.0), np.ones(len(texts), int)

    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for i in range(0, 1500, 50):
            asyncio.run(cache.embed(scope, [f"sentence number {j} of the test" for j in range(i, i + 50)], engine))
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert len(cache) < 1500 and cache.nbytes <= cache.max_bytes  # full: it evicted
    assert 0.7 * cache.max_bytes <= used <= cache.max_bytes, used


def test_a_reload_empties_the_models_entries_and_only_its_own():
    registry = fake_registry(main=FakeBackend(name="v1"), other=FakeBackend(name="o1"))
    try:
        for name in ("main", "other"):
            asyncio.run(registry.get(name).embed(["a b", "c"]))
        assert len(registry.cache) == 4
        new = registry.served(*_in_process(FakeBackend(name="v2")))
        old = registry.replace("main", new)
        assert len(registry.cache) == 2 and {key[0].name for key in registry.cache._entries} == {"other"}
        asyncio.run(registry.get("main").embed(["a b"]))
        assert sum(map(len, new.client.engine.backend.passes)) == 1  # the new graph embeds it afresh
        asyncio.run(registry.get("main").embed(["a b"]))
        assert sum(map(len, new.client.engine.backend.passes)) == 1
        asyncio.run(retire(old, 5))  # what the old model's last requests stored goes with it
        assert {key[0].name for key in registry.cache._entries} == {"other"}
        assert metric(registry, "sembed_cache_bytes") == registry.cache.nbytes > 0
        assert metric(registry, "sembed_cache_entries") == len(registry.cache) == 2
    finally:
        asyncio.run(registry.close())


def _in_process(backend: FakeBackend):
    from service.api.client import InProcessEngineClient

    engine = Engine(backend)
    engine.start()
    return InProcessEngineClient(engine), backend.tokenizer


def metric(registry, name: str, **labels: str) -> float:
    """One sample of the registry's exposition (0 if absent)."""
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in registry.metrics.exposition().decode().splitlines():
        if line.rsplit(" ", 1)[0] == want:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_hits_and_misses_per_model(registry):
    served = registry.get()
    asyncio.run(served.embed(["a", "b"]))
    asyncio.run(served.embed(["a", "c", "c"]))
    assert metric(registry, "sembed_cache_misses_total", model="main") == 4  # a, b; then c twice
    assert metric(registry, "sembed_cache_hits_total", model="main") == 1
    assert metric(registry, "sembed_cache_entries") == 3 and metric(registry, "sembed_cache_bytes") > 3 * 8 * 4


def test_zero_megabytes_is_off():
    registry = fake_registry(cache_mb=Settings(cache_mb=0).cache_mb)
    try:
        for _ in range(2):
            asyncio.run(registry.get().embed(["a b"]))
        assert embedded(registry) == 2 and len(registry.cache) == 0
        assert metric(registry, "sembed_cache_misses_total", model="main") == 0
    finally:
        asyncio.run(registry.close())


# --- the API over a real export ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def apps(default_export):
    """The default export served twice from one engine: through the cache, and without one."""
    from service.engine.socket_server import load_engine

    settings = Settings(model_dir=default_export)
    engine = load_engine(settings, default_export)
    cached, plain = ModelRegistry(cache_mb=8), ModelRegistry()
    cached.add_in_process("m", engine)
    plain.add_in_process("m", engine)
    with TestClient(create_app(settings, cached)) as c, TestClient(create_app(settings, plain)) as p:
        yield c, p, cached


TEXTS = ["A man is playing a guitar.", "The cat sleeps on the warm windowsill.", "Stocks fell sharply on Monday.",
         "A woman slices an onion.", "Rain is expected tomorrow in the north."]


def test_a_repeated_embed_is_served_from_the_cache_with_identical_bytes(apps):
    client, plain, registry = apps
    hits = metric(registry, "sembed_cache_hits_total", model="m")
    first = client.post("/embed", json={"inputs": TEXTS[:2]})
    again = client.post("/embed", json={"inputs": TEXTS[:2]})
    assert first.status_code == again.status_code == 200
    assert again.content == first.content == plain.post("/embed", json={"inputs": TEXTS[:2]}).content
    assert metric(registry, "sembed_cache_hits_total", model="m") == hits + 2
    # a mixed batch: cached and new texts, one twice, in the request's order
    body = {"inputs": [TEXTS[2], TEXTS[1], TEXTS[3], TEXTS[0], TEXTS[2]]}
    assert client.post("/embed", json=body).content == plain.post("/embed", json=body).content
    assert metric(registry, "sembed_cache_hits_total", model="m") == hits + 4
    assert "sembed_cache_hits_total" in client.get("/metrics").text


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/embeddings", {"input": TEXTS, "model": "m"}),
    ("/v1/embeddings", {"input": TEXTS, "model": "m", "dimensions": 128, "encoding_format": "base64"}),
    ("/v2/embed", {"texts": TEXTS, "model": "m", "embedding_types": ["float", "int8"], "output_dimension": 256}),
    ("/embed", {"inputs": TEXTS, "dimensions": 64}),
    ("/embed", {"inputs": TEXTS, "embedding_type": "binary"}),
    ("/similarity", {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}),
])
def test_every_embedding_route_goes_through_the_cache(apps, path, body):
    """Dimensions and output types are cut from the cached full vector: a hit, the same answer as without a cache."""
    client, plain, registry = apps
    client.post("/embed", json={"inputs": TEXTS})  # every text cached, at full width
    hits = metric(registry, "sembed_cache_hits_total", model="m")
    served, expected = client.post(path, json=body), plain.post(path, json=body)
    assert served.status_code == expected.status_code == 200, served.text
    assert metric(registry, "sembed_cache_hits_total", model="m") == hits + len(TEXTS)
    a, b = served.json(), expected.json()
    for answer in (a, b):
        if isinstance(answer, dict):
            answer.pop("id", None)  # Cohere's: the request's id
    assert a == b


def test_documents_indexed_after_their_text_was_embedded_are_hits(apps):
    client, _, registry = apps
    client.post("/embed", json={"inputs": TEXTS})
    hits = metric(registry, "sembed_cache_hits_total", model="m")
    docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)]
    assert client.post("/index/documents", json={"documents": docs}).status_code == 200
    assert metric(registry, "sembed_cache_hits_total", model="m") == hits + len(TEXTS)
    found = client.post("/search", json={"query": TEXTS[3], "k": 1}).json()["results"][0][0]
    assert found["id"] == "d3" and found["score"] == pytest.approx(1.0, abs=1e-5)
