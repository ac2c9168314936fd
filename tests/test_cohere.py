"""Cohere's API and the output types end to end: the real `cohere` SDK (ClientV2, Client) and `openai` against a
live `python -m service` serving the real default export (with prompts in a copy of its manifest), a copy with
no calibration ranges (an export made before them) and a tiny random-weight reranker, side by side
(SEMBED_MODELS). Every quantised answer is checked against sentence-transformers' quantize_embeddings of the
float vectors the service gives for the same texts."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from sentence_transformers import quantize_embeddings

from service.manifest import MANIFEST_FILE
from tests.conftest import ServiceProcess

cohere = pytest.importorskip("cohere")
from cohere.core.api_error import ApiError as CohereError  # noqa: E402 - after the skip

TEXTS = ["A man is playing a guitar.", "A person plays the guitar.", "Stocks fell sharply on Monday."]
#: no "classification" prompt: that input type embeds the texts as they are
PROMPTS = {"query": "query: ", "passage": "passage: ", "clustering": "cluster: "}
LONG = " ".join(f"word{i}" for i in range(400))  # over the model's 256 tokens
TYPES = ["float", "int8", "uint8", "binary", "ubinary"]


def _copy(export: Path, out: Path, **changes) -> Path:
    """The export's files linked, its manifest changed (None removes a field)."""
    out.mkdir(parents=True)
    for entry in export.iterdir():
        if entry.name != MANIFEST_FILE:
            (out / entry.name).symlink_to(entry)
    manifest = json.loads((export / MANIFEST_FILE).read_text())
    manifest.update(changes)
    (out / MANIFEST_FILE).write_text(json.dumps({k: v for k, v in manifest.items() if v is not None}))
    return out


@pytest.fixture(scope="module")
def reranker(tmp_path_factory) -> Path:
    """A tiny random-weight BERT reranker (one label), exported as a pair scorer."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from export.__main__ import main as export_main
    from tests.tiny_models import build

    tmp = tmp_path_factory.mktemp("reranker")
    source = build("bert", tmp / "base")
    config = json.loads((source / "config.json").read_text())
    config.update(num_labels=1, architectures=["BertForSequenceClassification"])
    (source / "config.json").write_text(json.dumps(config))
    torch.manual_seed(1)
    AutoModelForSequenceClassification.from_pretrained(source).save_pretrained(source)
    (source / "modules.json").unlink()
    assert export_main(["--model", str(source), "--out", str(tmp / "out"), "--no-int8", "--no-fp16"]) == 0
    return tmp / "out"


@pytest.fixture(scope="module")
def served(default_export, reranker, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cohere")
    minilm = _copy(default_export, tmp / "minilm", prompts=PROMPTS)
    legacy = _copy(default_export, tmp / "legacy", calibration=None)
    with ServiceProcess({"SEMBED_MODELS": f"minilm={minilm},legacy={legacy},reranker={reranker}"},
                        tmp / "service.log") as service:
        yield service.url, json.loads((minilm / MANIFEST_FILE).read_text())


@pytest.fixture(scope="module")
def url(served) -> str:
    return served[0]


@pytest.fixture(scope="module")
def ranges(served) -> dict[str, np.ndarray]:
    return {d: np.asarray(r, dtype=np.float32) for d, r in served[1]["calibration"]["ranges"].items()}


@pytest.fixture(scope="module")
def co(url):
    return cohere.ClientV2(base_url=url, api_key="unused", timeout=60, max_retries=0)


def embed(url: str, body: dict) -> np.ndarray:
    r = httpx.post(f"{url}/embed", json={"model": "minilm", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return np.asarray(r.json())


def quantized(vectors: np.ndarray, kind: str, ranges: dict[str, np.ndarray]) -> np.ndarray:
    vectors = vectors.astype(np.float32)
    return quantize_embeddings(vectors, kind, ranges=ranges[str(vectors.shape[1])] if "int8" in kind else None)


def refused(call, status: int = 422) -> str:
    with pytest.raises(CohereError) as e:
        call()
    assert e.value.status_code == status, e.value.body
    # Cohere's error body (and the request id where the fault is the server's or the model's, as on every route)
    assert set(e.value.body) == ({"message", "request_id"} if status == 424 else {"message"}), e.value.body
    return e.value.body["message"]


def test_v2_embed_gives_every_type_as_quantize_embeddings_of_the_float_vectors(co, url, ranges):
    r = co.embed(model="minilm", texts=TEXTS, input_type="search_document", embedding_types=[*TYPES, "base64"])
    floats = np.asarray(r.embeddings.float_)
    assert np.allclose(floats, embed(url, {"inputs": TEXTS, "prompt_name": "passage"}), atol=1e-6)
    for kind in TYPES[1:]:
        got = np.asarray(getattr(r.embeddings, kind))
        expected = quantized(floats, kind, ranges)
        assert got.shape == expected.shape and np.array_equal(got, expected), kind
    assert np.asarray(r.embeddings.binary).shape == (3, 48)  # 384 sign bits, 8 to a byte
    decoded = np.stack([np.frombuffer(base64.b64decode(row), dtype="<f4") for row in r.embeddings.base64])
    assert np.array_equal(decoded, floats.astype(np.float32))
    assert r.texts == TEXTS and r.id and r.meta.api_version.version == "2"
    tokens = sum(map(len, httpx.post(f"{url}/tokenize", json={"model": "minilm", "inputs": TEXTS,
                                                                "prompt_name": "passage"}).json()))
    assert r.meta.billed_units.input_tokens == tokens
    # float alone by default
    plain = co.embed(model="minilm", texts=TEXTS, input_type="search_document")
    assert plain.embeddings.int8 is None and np.allclose(plain.embeddings.float_, floats, atol=1e-6)


def test_input_types_are_the_models_prompts(co, url):
    for input_type, body in (("search_query", {"prompt_name": "query"}),
                             ("search_document", {"prompt_name": "passage"}),
                             ("clustering", {"prompt_name": "clustering"}),
                             ("classification", {"instruction": ""})):  # no such prompt: the texts as they are
        r = co.embed(model="minilm", texts=TEXTS, input_type=input_type, embedding_types=["float"])
        assert np.allclose(r.embeddings.float_, embed(url, {"inputs": TEXTS, **body}), atol=1e-6), input_type
    image = refused(lambda: co.embed(model="minilm", texts=TEXTS, input_type="image"))
    assert "text only" in image


def test_output_dimension_cuts_and_renormalises_and_quantises_with_its_own_ranges(co, url, ranges):
    r = co.embed(model="minilm", texts=TEXTS, input_type="search_query", output_dimension=128,
                 embedding_types=["float", "int8", "ubinary"])
    floats = np.asarray(r.embeddings.float_)
    assert floats.shape == (3, 128)
    assert np.allclose(floats, embed(url, {"inputs": TEXTS, "prompt_name": "query", "dimensions": 128}), atol=1e-6)
    assert np.array_equal(r.embeddings.int8, quantized(floats, "int8", ranges))
    assert np.array_equal(r.embeddings.ubinary, quantized(floats, "ubinary", ranges))
    too_wide = refused(lambda: co.embed(model="minilm", texts=TEXTS, input_type="search_query", output_dimension=385))
    assert "output_dimension=385" in too_wide and "384" in too_wide
    uncalibrated = refused(lambda: co.embed(model="minilm", texts=TEXTS, input_type="search_query",
                                            output_dimension=100, embedding_types=["int8"]))
    assert "384, 256, 128, 64, 32" in uncalibrated
    # binary needs no ranges: any dimension
    r = co.embed(model="minilm", texts=TEXTS, input_type="search_query", output_dimension=100,
                 embedding_types=["binary"])
    assert np.asarray(r.embeddings.binary).shape == (3, 13)


def test_truncate_none_refuses_start_and_end_cut_that_side(co, url):
    message = refused(lambda: co.embed(model="minilm", texts=[LONG], input_type="classification", truncate="NONE"))
    assert "256" in message and "truncate END or START" in message
    for truncate, direction in (("START", "Left"), ("END", "Right")):
        r = co.embed(model="minilm", texts=[LONG], input_type="classification", truncate=truncate)
        expected = embed(url, {"inputs": [LONG], "instruction": "", "truncation_direction": direction})
        assert np.allclose(r.embeddings.float_, expected, atol=1e-6), truncate
    start = co.embed(model="minilm", texts=[LONG], input_type="classification", truncate="START")
    end = co.embed(model="minilm", texts=[LONG], input_type="classification", truncate="END")
    assert not np.allclose(start.embeddings.float_, end.embeddings.float_, atol=1e-3)


def test_what_cannot_be_served_is_refused_saying_why(co, url):
    unknown = refused(lambda: co.embed(model="minilm", texts=TEXTS, input_type="search_query",
                                       embedding_types=["int4"]))
    assert "embedding_types" in unknown and "int8" in unknown
    # an export made before the calibration ranges: int8 and uint8 refused with how to get them, the rest served
    for kind in ("int8", "uint8"):
        old = refused(lambda k=kind: co.embed(model="legacy", texts=TEXTS, input_type="search_query",
                                              embedding_types=[k]))
        assert "no calibration ranges" in old and "re-export" in old, old
    r = co.embed(model="legacy", texts=TEXTS, input_type="search_query", embedding_types=["float", "binary"])
    assert np.array_equal(r.embeddings.binary, quantize_embeddings(np.asarray(r.embeddings.float_, np.float32),
                                                                   "binary"))
    missing = refused(lambda: co.embed(model="embed-english-v3.0", texts=TEXTS, input_type="search_query"), 404)
    assert "minilm" in missing
    assert refused(lambda: co.embed(model="reranker", texts=TEXTS, input_type="search_query"), 424)
    too_few = refused(lambda: co.embed(model="minilm", texts=TEXTS, input_type="search_query", max_tokens=10))
    assert "max_tokens" in too_few


def test_v1_embed_answers_floats_or_by_type(url, ranges):
    co1 = cohere.Client(base_url=url, api_key="unused", timeout=60, max_retries=0)
    floats = co1.embed(texts=TEXTS, model="minilm", input_type="search_query")
    assert floats.response_type == "embeddings_floats"
    assert np.allclose(floats.embeddings, embed(url, {"inputs": TEXTS, "prompt_name": "query"}), atol=1e-6)
    typed = co1.embed(texts=TEXTS, model="minilm", input_type="search_query", embedding_types=["uint8"])
    assert typed.response_type == "embeddings_by_type"
    assert np.array_equal(typed.embeddings.uint8, quantized(np.asarray(floats.embeddings), "uint8", ranges))


def test_rerank_v2_and_v1_rank_as_rerank_does(co, url):
    query, docs = "Who is making music?", [*TEXTS, "Cheese is made from milk."]
    scores = {h["index"]: h["score"] for h in httpx.post(f"{url}/rerank", json={
        "model": "reranker", "query": query, "texts": docs}, timeout=60).json()}
    best = sorted(scores, key=lambda i: -scores[i])
    r = co.rerank(model="reranker", query=query, documents=docs, top_n=2)
    assert [x.index for x in r.results] == best[:2]
    assert [x.relevance_score for x in r.results] == pytest.approx([scores[i] for i in best[:2]], abs=1e-6)
    assert all(0 < x.relevance_score < 1 for x in r.results)  # the reranker's sigmoid, as Cohere's scores
    # Cohere's v1 SDK, documents returned
    co1 = cohere.Client(base_url=url, api_key="unused", timeout=60, max_retries=0)
    r1 = co1.rerank(model="reranker", query=query, documents=docs, top_n=3, return_documents=True)
    assert [(x.index, x.document.text) for x in r1.results] == [(i, docs[i]) for i in best[:3]]
    # the Cohere / Jina v1 shape RAG frameworks post: documents as {"text": ...} too
    answer = httpx.post(f"{url}/v1/rerank", json={"model": "reranker", "query": query, "return_documents": True,
                                                  "documents": [docs[0], *({"text": d} for d in docs[1:])]},
                        timeout=60)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [x["index"] for x in results] == best and results[0]["document"] == {"text": docs[best[0]]}
    assert answer.json()["usage"]["total_tokens"] > 0
    # an embedding model ranks by cosine, as /rerank does
    cosine = co.rerank(model="minilm", query=query, documents=docs)
    expected = httpx.post(f"{url}/rerank", json={"model": "minilm", "query": query, "texts": docs}).json()
    assert [x.index for x in cosine.results] == [h["index"] for h in expected]
    bad = httpx.post(f"{url}/v2/rerank", json={"model": "reranker", "query": query, "documents": [{"title": "x"}]})
    assert bad.status_code == 422 and "documents" in bad.json()["message"], bad.text


def test_embedding_type_on_tei_and_openai_routes(url, ranges):
    from openai import OpenAI

    floats = embed(url, {"inputs": TEXTS, "prompt_name": "query"})
    for kind in TYPES:
        got = embed(url, {"inputs": TEXTS, "prompt_name": "query", "embedding_type": kind})  # the guard's fast path
        assert np.array_equal(got, quantized(floats, kind, ranges)) if kind != "float" else \
            np.allclose(got, floats, atol=1e-6), kind
    cut = embed(url, {"inputs": TEXTS, "prompt_name": "query", "dimensions": 64, "embedding_type": "uint8"})
    assert np.array_equal(cut, quantized(embed(url, {"inputs": TEXTS, "prompt_name": "query", "dimensions": 64}),
                                         "uint8", ranges))
    # huggingface_hub's `parameters` carries it too (the slow path: the guard leaves such bodies to FastAPI)
    nested = httpx.post(f"{url}/", json={"inputs": TEXTS, "parameters": {"prompt_name": "query",
                                                                         "embedding_type": "binary"},
                                         "model": "minilm"}).json()
    assert np.array_equal(nested, quantized(floats, "binary", ranges))
    raw = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "model": "minilm", "normalize": False,
                                           "embedding_type": "int8"})
    assert raw.status_code == 422 and "normalize=true" in raw.json()["error"], raw.text
    bad = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "embedding_type": "int4"})
    assert bad.status_code == 422 and "embedding_type" in bad.json()["error"], bad.text

    api = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    for kind in ("int8", "ubinary"):
        listed = api.embeddings.create(input=TEXTS, model="minilm", encoding_format="float",
                                       extra_body={"prompt_name": "query", "embedding_type": kind})
        assert np.array_equal([d.embedding for d in listed.data], quantized(floats, kind, ranges)), kind
    # base64: each row's bytes (the openai client hands base64 strings back as they came when asked for them)
    packed = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "model": "minilm", "encoding_format": "base64",
                                                      "prompt_name": "query", "embedding_type": "int8"}).json()
    rows = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.int8) for d in packed["data"]])
    assert np.array_equal(rows, quantized(floats, "int8", ranges))
    old = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "model": "legacy", "embedding_type": "uint8"})
    assert old.status_code == 422 and "no calibration ranges" in old.json()["error"]["message"], old.text
