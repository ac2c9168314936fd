"""Prompts end to end (issue 38): an export whose manifest names sentence-transformers' prompts is served
as sentence-transformers' encode(prompt_name=, prompt=) embeds, prompt + text, over real HTTP clients.

The prompted export is the real default export with prompts written into its manifest: the graph is the
same, so a prompt's whole effect is its text put before each input, which the plain export shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.manifest import MANIFEST_FILE
from service.settings import Settings
from tests.conftest import LiveServer

LONG_PROMPT = " ".join(["word"] * 300)  # over the model's 256 tokens alone
PROMPTS = {"query": "query: ", "doc": "passage: ", "huge": LONG_PROMPT}
TEXTS = ["A man is playing a guitar.", "A person plays the guitar.", "Stocks fell sharply on Monday."]
MODEL = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def prompted_export(default_export, tmp_path_factory) -> Path:
    """The default export (its files linked, not copied) with prompts and a default prompt in its manifest."""
    out = tmp_path_factory.mktemp("prompted") / MODEL
    out.mkdir()
    for entry in default_export.iterdir():
        if entry.name != MANIFEST_FILE:
            (out / entry.name).symlink_to(entry)
    manifest = json.loads((default_export / MANIFEST_FILE).read_text())
    manifest.update(format_version=3, prompts=PROMPTS, default_prompt_name="query")
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def client(prompted_export):
    with LiveServer(Settings(model_dir=prompted_export)) as server, \
            httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def plain(live_service):
    """The unmodified default export, served: no prompts."""
    with httpx.Client(base_url=live_service.url, timeout=60) as c:
        yield c


def url(client) -> str:
    return str(client.base_url).rstrip("/")


def embed(client, body) -> np.ndarray:
    r = client.post("/embed", json=body)
    assert r.status_code == 200, r.text
    return np.asarray(r.json(), dtype=np.float32)


def refused(client, path, body) -> dict:
    r = client.post(path, json=body)
    assert r.status_code == 422, r.text
    return r.json()


def test_a_prompt_embeds_as_its_text_before_each_input(client, plain):
    for name, prompt in (("doc", "passage: "), ("query", "query: ")):
        served = embed(client, {"inputs": TEXTS, "prompt_name": name})
        expected = embed(plain, {"inputs": [prompt + t for t in TEXTS]})
        assert np.allclose(served, expected, atol=1e-6), name
    # the default prompt where none is named; an instruction is the prompt's text itself; "" is no prompt at all
    assert np.allclose(embed(client, {"inputs": TEXTS}), embed(plain, {"inputs": ["query: " + t for t in TEXTS]}),
                       atol=1e-6)
    mine = "Represent this sentence for retrieval: "
    assert np.allclose(embed(client, {"inputs": TEXTS, "instruction": mine}),
                       embed(plain, {"inputs": [mine + t for t in TEXTS]}), atol=1e-6)
    assert np.allclose(embed(client, {"inputs": TEXTS, "instruction": ""}), embed(plain, {"inputs": TEXTS}),
                       atol=1e-6)
    # TEI's /similarity takes it too, in `parameters` as huggingface_hub nests it
    docs = embed(client, {"inputs": TEXTS, "prompt_name": "doc"})
    scores = client.post("/similarity", json={"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]},
                                              "parameters": {"prompt_name": "doc"}}).json()
    assert scores == pytest.approx((docs[1:] @ docs[0]).tolist(), abs=1e-6)


def test_the_service_matches_sentence_transformers(client, default_model_dir):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(default_model_dir), device="cpu", prompts=PROMPTS, default_prompt_name="query")
    mine = "Represent this sentence for retrieval: "
    for body, kwargs in (({}, {}), ({"prompt_name": "doc"}, {"prompt_name": "doc"}),
                         ({"instruction": mine}, {"prompt": mine})):
        expected = model.encode(TEXTS, normalize_embeddings=True, **kwargs)
        served = embed(client, {"inputs": TEXTS, **body})
        assert np.abs(served - expected).max() < 1e-4, body


def test_prompt_tokens_are_counted_and_tokenised_as_embedded(client, plain):
    from openai import OpenAI

    tokens = [len(t) for t in plain.post("/tokenize", json={"inputs": ["passage: " + t for t in TEXTS]}).json()]
    assert client.post("/tokenize", json={"inputs": TEXTS, "prompt_name": "doc"}).json() == \
        plain.post("/tokenize", json={"inputs": ["passage: " + t for t in TEXTS]}).json()
    r = client.post("/embed", json={"inputs": TEXTS, "prompt_name": "doc"})
    assert r.headers["x-compute-tokens"] == str(sum(tokens))

    api = OpenAI(base_url=f"{url(client)}/v1", api_key="unused", max_retries=0)
    doc = api.embeddings.create(input=TEXTS, model=MODEL, encoding_format="float", extra_body={"prompt_name": "doc"})
    assert np.allclose([d.embedding for d in doc.data], embed(client, {"inputs": TEXTS, "prompt_name": "doc"}),
                       atol=1e-6)
    assert doc.usage.prompt_tokens == sum(tokens)
    default = api.embeddings.create(input=TEXTS, model=MODEL, encoding_format="float")
    assert np.allclose([d.embedding for d in default.data], embed(plain, {"inputs": ["query: " + t for t in TEXTS]}),
                       atol=1e-6)
    query_tokens = sum(map(len, plain.post("/tokenize", json={"inputs": ["query: " + t for t in TEXTS]}).json()))
    assert default.usage.prompt_tokens == query_tokens
    mine = api.embeddings.create(input=TEXTS[0], model=MODEL, encoding_format="float",
                                 extra_body={"instruction": "passage: "})
    assert np.allclose(mine.data[0].embedding, doc.data[0].embedding, atol=1e-6)


def test_token_ids_take_no_prompt(client, plain):
    ids = [t["id"] for t in plain.post("/tokenize", json={"inputs": TEXTS[0]}).json()[0]]
    r = client.post("/v1/embeddings", json={"input": [ids], "model": MODEL})  # the default prompt is not applied
    assert r.status_code == 200, r.text
    assert np.allclose(r.json()["data"][0]["embedding"], embed(plain, {"inputs": TEXTS[0]})[0], atol=1e-6)
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    for field, value in (("prompt_name", "doc"), ("instruction", "passage: ")):
        error = refused(client, "/v1/embeddings", {"input": [ids], "model": MODEL, field: value})["error"]
        assert error["param"] == field and "token ids" in error["message"]


def test_the_huggingface_hub_client_sends_prompt_name(client, monkeypatch):
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "is_offline_mode", lambda: False)  # it talks only to our local service
    hf = InferenceClient(model=url(client))
    vectors = np.asarray(hf.feature_extraction(TEXTS[0], prompt_name="doc"), dtype=np.float32)
    assert np.allclose(vectors, embed(client, {"inputs": TEXTS[0], "prompt_name": "doc"}), atol=1e-6)


def test_an_unknown_prompt_name_lists_the_models_prompts(client, plain):
    body = refused(client, "/embed", {"inputs": TEXTS, "prompt_name": "passage"})
    assert body["error_type"] == "Validation" and body["detail"] == {"prompts": ["doc", "huge", "query"]}
    assert "'passage'" in body["error"] and "'doc', 'huge', 'query'" in body["error"]
    error = refused(client, "/v1/embeddings", {"input": TEXTS, "model": MODEL, "prompt_name": "passage"})["error"]
    assert error["param"] == "prompt_name" and error["code"] == "invalid_request"
    assert "'doc', 'huge', 'query'" in error["message"]
    assert "'passage'" in refused(client, "/tokenize", {"inputs": "x", "prompt_name": "passage"})["error"]
    # a model without prompts says it has none (TEI answered "Input should be None" here)
    body = refused(plain, "/embed", {"inputs": "x", "prompt_name": "query"})
    assert body["detail"] == {"prompts": []} and "its prompts: none" in body["error"]


def test_prompt_name_and_instruction_together_are_refused(client):
    both = {"prompt_name": "doc", "instruction": "passage: "}
    assert "not both" in refused(client, "/embed", {"inputs": TEXTS, **both})["error"]
    assert "not both" in refused(client, "/v1/embeddings", {"input": TEXTS, "model": MODEL, **both})["error"]["message"]


def test_the_length_limit_counts_the_prompt(client, plain):
    text = " ".join(["word"] * 254)  # 256 tokens with [CLS] and [SEP]: the model's limit exactly
    assert len(plain.post("/tokenize", json={"inputs": text}).json()[0]) == 256
    embed(client, {"inputs": text, "instruction": "", "truncate": False})
    body = refused(client, "/embed", {"inputs": [TEXTS[0], text], "truncate": False})  # the default prompt's
    assert "inputs[1] with its prompt has 258 tokens" in body["error"] and "at most 256" in body["error"]
    cut = embed(client, {"inputs": text, "prompt_name": "doc", "truncate": True})
    assert np.allclose(cut, embed(plain, {"inputs": "passage: " + text, "truncate": True}), atol=1e-6)


def test_a_prompt_that_fills_the_window_is_refused(client):
    body = refused(client, "/embed", {"inputs": TEXTS, "prompt_name": "huge"})
    assert "prompt 'huge'" in body["error"] and "302 tokens" in body["error"] and "at most 256" in body["error"]
    instruction = " ".join(["word"] * 254)  # 256 with the special tokens: no token left for the text
    error = refused(client, "/v1/embeddings", {"input": "x", "model": MODEL, "instruction": instruction})["error"]
    assert error["param"] == "instruction" and "the instruction" in error["message"]
    assert "256 tokens" in error["message"] and "no room is left" in error["message"]
    embed(client, {"inputs": "x", "instruction": " ".join(["word"] * 253)})  # one token left: served


def test_info_reports_the_prompts(client, plain):
    info = client.get("/info").json()
    assert info["prompts"] == PROMPTS and info["default_prompt_name"] == "query"
    assert info["manifest"]["prompts"] == PROMPTS
    plain_info = plain.get("/info").json()
    assert plain_info["prompts"] == {} and plain_info["default_prompt_name"] is None
