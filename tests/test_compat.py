"""Drop-in compatibility on the real default export: TEI's request and answer shapes, and the real
`openai` and `huggingface_hub` clients against the live service."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

GUITAR = "A man is playing a guitar."
TEXTS = [GUITAR, "A person plays the guitar.", "Stocks fell sharply on Monday."]


@pytest.fixture(scope="module")
def client(live_service):
    with httpx.Client(base_url=live_service.url, timeout=60) as c:
        yield c


def embed(client, body) -> np.ndarray:
    r = client.post("/embed", json=body)
    assert r.status_code == 200, r.text
    return np.asarray(r.json(), dtype=np.float32)


def test_tei_embed_options(client):
    full = embed(client, {"inputs": TEXTS})
    cut = embed(client, {"inputs": TEXTS, "dimensions": 128})
    expected = full[:, :128] / np.linalg.norm(full[:, :128], axis=1, keepdims=True)
    assert cut.shape == (3, 128) and np.allclose(cut, expected, atol=1e-6)
    assert client.post("/embed", json={"inputs": "x", "dimensions": 385}).status_code == 422
    raw_cut = embed(client, {"inputs": TEXTS, "dimensions": 64, "normalize": False})  # a column slice, served
    assert np.array_equal(raw_cut, embed(client, {"inputs": TEXTS, "normalize": False})[:, :64])

    long = " ".join(f"word{i}" for i in range(400))  # over 256 tokens: which end is cut matters
    right = embed(client, {"inputs": long, "truncation_direction": "Right"})
    left = embed(client, {"inputs": long, "truncation_direction": "Left"})
    assert not np.allclose(right, left, atol=1e-3)
    assert np.array_equal(right, embed(client, {"inputs": long}))

    raw = embed(client, {"inputs": GUITAR, "parameters": {"normalize": False}})  # InferenceClient's nesting
    assert abs(np.linalg.norm(raw) - 1) > 1e-3
    assert client.post("/embed", json={"inputs": "x", "some_future_field": 1}).status_code == 200  # as TEI
    assert client.post("/embed", json={"inputs": "x", "prompt_name": "query"}).status_code == 422


def test_tei_similarity_and_rerank_agree(client):
    scores = client.post("/similarity", json={"inputs": {"source_sentence": GUITAR, "sentences": TEXTS[1:]}}).json()
    ranked = client.post("/rerank", json={"query": GUITAR, "texts": TEXTS[::-1], "return_text": True}).json()
    assert [h["index"] for h in ranked] == [2, 1, 0]  # the query itself, the paraphrase, the unrelated text
    assert [h["text"] for h in ranked] == TEXTS
    assert ranked[0]["score"] == pytest.approx(1.0, abs=1e-5)
    assert ranked[1]["score"] == pytest.approx(scores[0], abs=1e-6)
    assert ranked[2]["score"] == pytest.approx(scores[1], abs=1e-6)
    assert "text" not in client.post("/rerank", json={"query": GUITAR, "texts": ["x"]}).json()[0]


def test_tei_tokenize(client):
    tokens = client.post("/tokenize", json={"inputs": "A man plays"}).json()
    assert [t["text"] for t in tokens[0]] == ["[CLS]", "A", "man", "plays", "[SEP]"]
    assert tokens[0][0]["special"] and tokens[0][0]["start"] is None
    assert (tokens[0][2]["start"], tokens[0][2]["stop"]) == (2, 5)
    bare = client.post("/tokenize", json={"inputs": ["A man plays"], "add_special_tokens": False}).json()
    assert [t["id"] for t in bare[0]] == [t["id"] for t in tokens[0][1:-1]]


def test_tei_decode_gives_back_what_tokenize_took(client):
    """TEI's /decode: ids (one sequence or a batch) back to text, special tokens left out unless asked for."""
    ids = [t["id"] for t in client.post("/tokenize", json={"inputs": "A man plays the guitar."}).json()[0]]
    assert client.post("/decode", json={"ids": ids}).json() == ["a man plays the guitar."]  # an uncased model
    both = client.post("/decode", json={"ids": [ids, ids[:3]], "skip_special_tokens": False}).json()
    assert both == ["[CLS] a man plays the guitar. [SEP]", "[CLS] a man"]
    for body, field in (({"ids": [1, 30522]}, "30522"), ({"ids": []}, "ids"), ({"ids": [[1], []]}, "ids"),
                        ({"ids": ["x"]}, "ids"), ({"ids": [-1]}, "-1")):
        refused = client.post("/decode", json=body)
        assert refused.status_code == 422 and field in refused.text, (body, refused.text)


def test_tei_info_fields(client, live_service):
    info = client.get("/info").json()
    for field in ("model_id", "model_sha", "model_dtype", "model_type", "max_concurrent_requests",
                  "max_input_length", "max_batch_tokens", "max_client_batch_size", "auto_truncate", "version",
                  "served_model_name"):
        assert field in info, field
    assert info["served_model_name"] == "all-MiniLM-L6-v2"
    assert info["max_input_length"] == 256 and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert client.get("/health").status_code == 200


def test_the_openai_client(live_service, client):
    from openai import NotFoundError, OpenAI, UnprocessableEntityError

    api = OpenAI(base_url=f"{live_service.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in api.models.list().data] == ["all-MiniLM-L6-v2"]
    expected = embed(client, {"inputs": TEXTS})
    default = api.embeddings.create(input=TEXTS, model="all-MiniLM-L6-v2")  # the client asks for base64
    assert np.array_equal(np.asarray([d.embedding for d in default.data], dtype=np.float32), expected)
    tokens = sum(len(t) for t in client.post("/tokenize", json={"inputs": TEXTS}).json())
    assert default.model == "all-MiniLM-L6-v2" and default.usage.prompt_tokens == tokens
    floats = api.embeddings.create(input=GUITAR, model="all-MiniLM-L6-v2", encoding_format="float")
    assert np.array_equal(np.asarray(floats.data[0].embedding, dtype=np.float32), expected[0])
    short = api.embeddings.create(input=GUITAR, model="all-MiniLM-L6-v2", dimensions=64)
    assert len(short.data[0].embedding) == 64 and np.linalg.norm(short.data[0].embedding) == pytest.approx(1, 1e-5)
    ids = [t["id"] for t in client.post("/tokenize", json={"inputs": GUITAR}).json()[0]]
    from_ids = api.embeddings.create(input=[ids, ids[:4]], model="all-MiniLM-L6-v2")
    assert np.array_equal(np.asarray(from_ids.data[0].embedding, dtype=np.float32), expected[0])
    assert from_ids.usage.prompt_tokens == len(ids) + 4
    for bad in ([10**7], [[]]):
        with pytest.raises(UnprocessableEntityError):
            api.embeddings.create(input=bad, model="all-MiniLM-L6-v2")
    with pytest.raises(NotFoundError, match="no model named") as missing:
        api.embeddings.create(input="x", model="text-embedding-3-small")
    assert missing.value.code == "model_not_found" and missing.value.type == "invalid_request_error"
    with pytest.raises(UnprocessableEntityError):
        api.embeddings.create(input=[], model="all-MiniLM-L6-v2")


def test_huggingface_hub_inference_client(live_service, client, monkeypatch):
    from huggingface_hub import InferenceClient, constants

    # The suite runs with HF_HUB_OFFLINE=1 (no hub here); this client talks only to our local service.
    monkeypatch.setattr(constants, "is_offline_mode", lambda: False)

    hf = InferenceClient(model=live_service.url)
    vectors = hf.feature_extraction(GUITAR)
    assert np.array_equal(np.asarray(vectors, dtype=np.float32), embed(client, {"inputs": GUITAR}))
    scores = hf.sentence_similarity(GUITAR, other_sentences=TEXTS[1:])
    expected = client.post("/similarity", json={"inputs": {"source_sentence": GUITAR, "sentences": TEXTS[1:]}})
    assert scores == pytest.approx(expected.json(), abs=1e-6)
    assert scores[0] > 0.7 > scores[1]


def test_empty_inputs_are_answered_as_each_protocol_answers_them(live_service):
    """TEI refuses an empty input with 422 (its validation error); OpenAI with 400 invalid_request_error."""
    tei = httpx.post(f"{live_service.url}/embed", json={"inputs": ["fine", ""]})
    assert tei.status_code == 422 and tei.json()["error_type"] == "Validation" and "inputs[1]" in tei.json()["error"]
    openai = httpx.post(f"{live_service.url}/v1/embeddings", json={"input": "", "model": "all-MiniLM-L6-v2"})
    assert openai.status_code == 400 and openai.json()["error"]["type"] == "invalid_request_error"
    assert openai.json()["error"]["param"] == "input"


def test_one_version_everywhere(live_service):
    from importlib.metadata import version

    assert httpx.get(f"{live_service.url}/info").json()["version"] == version("sembed")
    assert httpx.get(f"{live_service.url}/openapi.json").json()["info"]["version"] == version("sembed")
