"""The client libraries users have, each called as its own docs show, against a live `python -m service`:
huggingface_hub's InferenceClient, LangChain's HuggingFaceEndpointEmbeddings and OpenAIEmbeddings, LlamaIndex's
TextEmbeddingsInference and OpenAIEmbedding. Every answer is checked against the service's own routes (/embed,
/similarity, /predict: cosine >= 0.99999, or the same labels and scores), not only for "no exception". Then the
refusals: a route the model cannot serve answers TEI's 424 with TEI's sentence, which the clients' exceptions carry.

The openai client's own calls (float, base64, dimensions, token ids) are tested in tests/test_compat.py; Cohere's
SDK in tests/test_cohere.py.

Served: the default export with prompts in its manifest (tests/test_prompts.py's `prompted_export`: "query: " by
default, "passage: " as "doc"), and tiny random-weight reranker and classifier models built here. A second service
has the classifier as its default model: the TEI clients send no model name, so they reach the default model only.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import ServiceProcess
from tests.test_prompts import prompted_export  # noqa: F401 - a fixture, used by name

EMBEDDER, RERANKER, CLASSIFIER, SPLADE = "all-MiniLM-L6-v2", "reranker", "classifier", "splade"
LABELS = {0: "negative", 1: "positive"}
TEXTS = ["A man is playing a guitar.", "A person plays the guitar.", "Stocks fell sharply on Monday."]
LONG = " ".join(f"word{i}" for i in range(400))  # over the model's 256 tokens: which end is cut matters
MIN_COSINE = 0.99999

# TEI's sentences for a route the model cannot serve (core/src/infer.rs, router/src/http/server.rs), each a 424
# with error_type Backend
NOT_EMBEDDING = "Model is not an embedding model"
NOT_CLASSIFIER = "Model is not a classifier model"
NOT_RERANKER = "model is not a re-ranker model"
NOT_SPLADE = "Model is not an embedding model with SPLADE pooling"


def _pair_scorer(root: Path, name: str, labels: dict[int, str] | None) -> Path:
    """A tiny random-weight BERT *ForSequenceClassification, exported to root/name: one label makes it a reranker,
    several a classifier."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from export.__main__ import main as export_main
    from tests.tiny_models import build

    source = build("bert", root / f"{name}-source")
    (source / "modules.json").unlink()  # a plain Hugging Face directory, as rerankers and classifiers ship
    torch.manual_seed(3)
    options = {"num_labels": 1} if labels is None else {
        "num_labels": len(labels), "id2label": labels, "label2id": {v: k for k, v in labels.items()}}
    AutoModelForSequenceClassification.from_pretrained(source, **options).save_pretrained(source)
    assert export_main(["--model", str(source), "--out", str(root / name), "--no-int8", "--no-fp16"]) == 0
    return root / name


@pytest.fixture(scope="module")
def pair_scorers(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pair-scorers")
    return {RERANKER: _pair_scorer(root, RERANKER, None), CLASSIFIER: _pair_scorer(root, CLASSIFIER, LABELS)}


@pytest.fixture(scope="module")
def splade(tmp_path_factory) -> Path:
    """A tiny random-weight SPLADE model (tests/tiny_models.py), exported."""
    from core.sparse import SpladeEncoder
    from export.sparse import export_sparse
    from tests.tiny_models import build_splade

    root = tmp_path_factory.mktemp("splade")
    export_sparse(SpladeEncoder.from_pretrained(build_splade(root / "source")), root / SPLADE)
    return root / SPLADE


@pytest.fixture(scope="module")
def url(prompted_export, pair_scorers, tmp_path_factory):  # noqa: F811 - the imported fixture
    """The service: the prompted default export first (the default model), then the reranker and the classifier."""
    models = {EMBEDDER: prompted_export, **pair_scorers}
    spec = ",".join(f"{name}={path}" for name, path in models.items())
    with ServiceProcess({"SEMBED_MODELS": spec}, tmp_path_factory.mktemp("service") / "service.log") as service:
        yield service.url


@pytest.fixture(scope="module")
def classifier_url(pair_scorers, splade, tmp_path_factory):
    """A second service whose default model is the classifier (the reranker and a SPLADE model beside it)."""
    spec = ",".join(f"{name}={path}" for name, path in (
        (CLASSIFIER, pair_scorers[CLASSIFIER]), (RERANKER, pair_scorers[RERANKER]), (SPLADE, splade)))
    with ServiceProcess({"SEMBED_MODELS": spec}, tmp_path_factory.mktemp("service") / "service.log") as service:
        yield service.url


@pytest.fixture(scope="module", autouse=True)
def hub_online():
    """The suite runs with HF_HUB_OFFLINE=1 (there is no hub here); huggingface_hub's clients then refuse every
    request, even to a URL. These talk only to the local services."""
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "is_offline_mode", lambda: False)
        yield


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def embed(url: str, **body) -> np.ndarray:
    """/embed's vectors, the reference each client's answer is checked against."""
    r = post(url, "/embed", body)
    assert r.status_code == 200, r.text
    return np.asarray(r.json(), dtype=np.float64)


def assert_same(got, expected: np.ndarray) -> None:
    """The same vectors: each row at cosine >= MIN_COSINE to /embed's, and of the same length (normalised or not)."""
    got = np.asarray(got, dtype=np.float64).reshape(expected.shape)
    cosine = (got * expected).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= MIN_COSINE, cosine
    assert np.allclose(np.linalg.norm(got, axis=1), np.linalg.norm(expected, axis=1), rtol=1e-5)


# --- huggingface_hub ----------------------------------------------------------------------------------------


def test_inference_client_feature_extraction(url):
    """InferenceClient(model=<url>).feature_extraction with every option it sends (TEI's /embed fields)."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=url)
    assert_same(client.feature_extraction(TEXTS[0]), embed(url, inputs=TEXTS[0]))
    assert_same(client.feature_extraction(TEXTS), embed(url, inputs=TEXTS))
    raw = client.feature_extraction(TEXTS, normalize=False)
    assert_same(raw, embed(url, inputs=TEXTS, normalize=False))
    assert np.abs(np.linalg.norm(raw, axis=1) - 1).min() > 1e-3  # really not normalised
    short = client.feature_extraction(TEXTS, dimensions=64)
    assert short.shape == (3, 64)
    assert_same(short, embed(url, inputs=TEXTS, dimensions=64))
    left = client.feature_extraction(LONG, truncate=True, truncation_direction="left")
    assert_same(left, embed(url, inputs=LONG, truncation_direction="Left"))
    assert not np.allclose(left, embed(url, inputs=LONG), atol=1e-3)  # the right end cut differs
    # TEI's /embed has no encoding_format: the client sends it and parses floats, so floats it must get
    assert_same(client.feature_extraction(TEXTS, encoding_format="base64"), embed(url, inputs=TEXTS))
    # a prompt by name is its text before each input (the default prompt "query: " is replaced, not added to)
    doc = client.feature_extraction(TEXTS, prompt_name="doc")
    assert_same(doc, embed(url, inputs=[f"passage: {t}" for t in TEXTS], instruction=""))
    assert not np.allclose(doc, embed(url, inputs=TEXTS), atol=1e-3)


def test_inference_client_sentence_similarity(url):
    from huggingface_hub import InferenceClient

    scores = InferenceClient(model=url).sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    expected = post(url, "/similarity", {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}).json()
    assert scores == pytest.approx(expected, abs=1e-6)
    assert scores[0] > 0.7 > scores[1]


def test_inference_client_text_classification(classifier_url):
    """text_classification posts to the bare URL, which answers the served model's task as TEI's does (/predict
    for a classifier). TEI answers one text with a flat list of labels; this client then returns its first element,
    the best label, as it does against TEI."""
    from huggingface_hub import InferenceClient

    expected = post(classifier_url, "/predict", {"inputs": TEXTS[0]}).json()
    assert sorted(p["label"] for p in expected) == sorted(LABELS.values())
    assert expected[0]["score"] >= expected[1]["score"]
    for client in (InferenceClient(model=classifier_url), InferenceClient(model=f"{classifier_url}/predict")):
        best = client.text_classification(TEXTS[0])
        assert (best.label, best.score) == (expected[0]["label"], pytest.approx(expected[0]["score"], abs=1e-6))
    raw = post(classifier_url, "/predict", {"inputs": TEXTS[0], "raw_scores": True}).json()
    softmax = np.exp([p["score"] for p in raw]) / np.exp([p["score"] for p in raw]).sum()
    assert [p["score"] for p in expected] == pytest.approx(softmax.tolist(), abs=1e-6)


def test_inference_client_endpoint_info_and_health(url):
    """get_endpoint_info (GET /info) and health_check (GET /health); huggingface_hub 1.x asks for the
    hf-inference provider by name to allow either against a URL."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=url, provider="hf-inference")
    info = client.get_endpoint_info()
    assert info == httpx.get(f"{url}/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["max_input_length"] == 256
    assert client.health_check() is True


# --- LangChain ----------------------------------------------------------------------------------------------


def test_langchain_huggingface_endpoint_embeddings(url):
    """HuggingFaceEndpointEmbeddings(model=<url>) (langchain-huggingface 1.2.1: later releases refuse a URL)."""
    from langchain_huggingface import HuggingFaceEndpointEmbeddings

    embeddings = HuggingFaceEndpointEmbeddings(model=url)
    assert_same(embeddings.embed_documents(TEXTS), embed(url, inputs=TEXTS))
    assert_same([embeddings.embed_query(TEXTS[0])], embed(url, inputs=TEXTS[0]))
    assert_same(asyncio.run(embeddings.aembed_documents(TEXTS)), embed(url, inputs=TEXTS))
    # model_kwargs go to feature_extraction: a prompt by name
    documents = HuggingFaceEndpointEmbeddings(model=url, model_kwargs={"prompt_name": "doc"})
    assert_same(documents.embed_documents(TEXTS), embed(url, inputs=TEXTS, prompt_name="doc"))


def test_langchain_openai_embeddings(url):
    """OpenAIEmbeddings against /v1 with check_embedding_ctx_length=False, as its docs say for OpenAI-compatible
    servers: by default it tokenises with tiktoken (which downloads its encoding, so it cannot run offline) and sends
    OpenAI's token ids, which are not this model's."""
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(model=EMBEDDER, base_url=f"{url}/v1", api_key="unused",
                                  check_embedding_ctx_length=False)
    assert_same(embeddings.embed_documents(TEXTS), embed(url, inputs=TEXTS))
    assert_same([embeddings.embed_query(TEXTS[0])], embed(url, inputs=TEXTS[0]))
    assert_same(asyncio.run(embeddings.aembed_documents(TEXTS)), embed(url, inputs=TEXTS))
    assert_same(embeddings.embed_documents(TEXTS, chunk_size=2), embed(url, inputs=TEXTS))  # two requests
    short = OpenAIEmbeddings(model=EMBEDDER, base_url=f"{url}/v1", api_key="unused", dimensions=64,
                             check_embedding_ctx_length=False)
    assert_same(short.embed_documents(TEXTS), embed(url, inputs=TEXTS, dimensions=64))


# --- LlamaIndex ---------------------------------------------------------------------------------------------


def test_llamaindex_text_embeddings_inference(url):
    """TextEmbeddingsInference posts {"inputs", "truncate"} to <base_url>/embed; query_instruction and
    text_instruction are text it puts before each input itself."""
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    model = TextEmbeddingsInference(model_name=EMBEDDER, base_url=url, timeout=60)
    assert_same(model.get_text_embedding_batch(TEXTS), embed(url, inputs=TEXTS))
    assert_same([model.get_query_embedding(TEXTS[0])], embed(url, inputs=TEXTS[0]))
    assert_same([model.get_text_embedding(LONG)], embed(url, inputs=LONG))  # truncate_text: true
    assert_same([asyncio.run(model.aget_text_embedding(TEXTS[1]))], embed(url, inputs=TEXTS[1]))
    instructed = TextEmbeddingsInference(model_name=EMBEDDER, base_url=url, query_instruction="passage: ")
    assert_same([instructed.get_query_embedding(TEXTS[0])], embed(url, inputs=f"passage: {TEXTS[0]}"))


def test_llamaindex_openai_embedding(url):
    """OpenAIEmbedding takes another server's model by model_name (its `model` must be one of OpenAI's) and the
    server by api_base; it sends text, so it runs offline."""
    from llama_index.embeddings.openai import OpenAIEmbedding

    model = OpenAIEmbedding(model_name=EMBEDDER, api_base=f"{url}/v1", api_key="unused")
    assert_same(model.get_text_embedding_batch(TEXTS), embed(url, inputs=TEXTS))
    assert_same([model.get_query_embedding(TEXTS[0])], embed(url, inputs=TEXTS[0]))
    assert_same([asyncio.run(model.aget_query_embedding(TEXTS[2]))], embed(url, inputs=TEXTS[2]))
    short = OpenAIEmbedding(model_name=EMBEDDER, api_base=f"{url}/v1", api_key="unused", dimensions=64)
    assert_same(short.get_text_embedding_batch(TEXTS), embed(url, inputs=TEXTS, dimensions=64))


# --- routes the model cannot serve --------------------------------------------------------------------------

ROUTES = {
    "/embed": {"inputs": "x"},
    "/similarity": {"inputs": {"source_sentence": "a", "sentences": ["b"]}},
    "/rerank": {"query": "a", "texts": ["b", "c"]},
    "/predict": {"inputs": "x"},
    "/tokenize": {"inputs": "x"},
    "/decode": {"ids": [1037]},
    "/embed_all": {"inputs": "x"},
    "/embed_sparse": {"inputs": "x"},
    "/v1/embeddings": {"input": "x"},
}
#: what each route answers each kind of model: 200, or TEI's 424 sentence
ANSWERS: dict[str, dict[str, int | str]] = {
    "/embed": {EMBEDDER: 200, RERANKER: NOT_EMBEDDING, CLASSIFIER: NOT_EMBEDDING},
    "/similarity": {EMBEDDER: 200, RERANKER: NOT_EMBEDDING, CLASSIFIER: NOT_EMBEDDING},
    "/rerank": {EMBEDDER: 200, RERANKER: 200, CLASSIFIER: NOT_RERANKER},  # an embedder: by cosine (ours)
    "/predict": {EMBEDDER: NOT_CLASSIFIER, RERANKER: 200, CLASSIFIER: 200},  # a reranker: its one label, as TEI
    "/tokenize": {EMBEDDER: 200, RERANKER: 200, CLASSIFIER: 200},
    "/decode": {EMBEDDER: 200, RERANKER: 200, CLASSIFIER: 200},
    "/embed_all": {EMBEDDER: 200, RERANKER: NOT_EMBEDDING, CLASSIFIER: NOT_EMBEDDING},
    "/embed_sparse": {EMBEDDER: NOT_SPLADE, RERANKER: NOT_SPLADE, CLASSIFIER: NOT_SPLADE},
    "/v1/embeddings": {EMBEDDER: 200, RERANKER: NOT_EMBEDDING, CLASSIFIER: NOT_EMBEDDING},
}


@pytest.mark.parametrize("path", list(ROUTES))
def test_every_route_serves_its_kinds_of_model_and_refuses_the_rest_as_tei(url, path):
    """Each route × model kind: served, or TEI's 424 (error_type Backend, TEI's sentence first), never a bare
    404. OpenAI's route says it in OpenAI's body."""
    if path not in httpx.get(f"{url}/openapi.json").json()["paths"]:
        pytest.skip(f"{path} is not served by this version")
    for name, answer in ANSWERS[path].items():
        r = post(url, path, {**ROUTES[path], "model": name})
        if answer == 200:
            assert r.status_code == 200, (name, r.text)
            continue
        assert r.status_code == 424, (name, r.text)
        body = r.json()
        message = body["error"]["message"] if path.startswith("/v1/") else body["error"]
        assert message.startswith(f"{answer}: ") and name in message, (name, message)
        if path.startswith("/v1/"):
            assert body["error"]["type"] == "server_error" and body["error"]["code"] == "backend"
        else:
            assert body["error_type"] == "Backend" and body["request_id"] == r.headers["x-request-id"]


def test_a_reranker_answers_predict_as_teis_does(url):
    """TEI's /predict takes a reranker (a one-label classifier): its label, its /rerank score."""
    ranked = post(url, "/rerank", {"query": TEXTS[0], "texts": TEXTS[1:], "model": RERANKER}).json()
    by_index = {hit["index"]: hit["score"] for hit in ranked}
    pairs = post(url, "/predict", {"inputs": [[TEXTS[0], t] for t in TEXTS[1:]], "model": RERANKER}).json()
    assert [[p["label"] for p in answer] for answer in pairs] == [["LABEL_0"], ["LABEL_0"]]
    assert [answer[0]["score"] for answer in pairs] == pytest.approx([by_index[0], by_index[1]], abs=1e-6)
    raw = post(url, "/predict", {"inputs": [TEXTS[0], TEXTS[1]], "model": RERANKER, "raw_scores": True}).json()
    assert 1 / (1 + np.exp(-raw[0]["score"])) == pytest.approx(by_index[0], abs=1e-6)


def test_the_bare_route_answers_the_models_task_as_teis(url, classifier_url):
    """POST / is the served model's task: an embedder's /embed or /similarity, a classifier's /predict, a
    reranker's /rerank, a SPLADE model's /embed_sparse (the body's `model` picks among the served)."""
    assert_same(post(url, "/", {"inputs": TEXTS}).json(), embed(url, inputs=TEXTS))
    assert post(classifier_url, "/", {"inputs": TEXTS[0]}).json() == post(
        classifier_url, "/predict", {"inputs": TEXTS[0]}).json()
    sparse = {"inputs": TEXTS, "model": SPLADE}
    assert post(classifier_url, "/", sparse).json() == post(classifier_url, "/embed_sparse", sparse).json()
    rerank = {"query": TEXTS[0], "texts": TEXTS[1:], "model": RERANKER}
    assert post(url, "/", rerank).json() == post(url, "/rerank", rerank).json()
    refused = post(url, "/", {"inputs": "x", "model": RERANKER})  # a reranker's body is a query and texts
    assert refused.status_code == 422 and "query" in refused.json()["error"]


def test_the_clients_exceptions_carry_the_refusal(url, classifier_url):
    """What a user of each client sees when the model cannot serve the call: the status and TEI's sentence. (At
    the bare URL of a classifier, feature_extraction gets /predict's labels, as from TEI, and fails to parse them:
    these name /embed.)"""
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import HfHubHTTPError
    from langchain_huggingface import HuggingFaceEndpointEmbeddings
    from openai import APIStatusError, OpenAI

    with pytest.raises(HfHubHTTPError, match=NOT_CLASSIFIER) as refused:
        InferenceClient(model=f"{url}/predict").text_classification(TEXTS[0])
    assert refused.value.response.status_code == 424
    with pytest.raises(HfHubHTTPError, match=f"{NOT_EMBEDDING}: model 'classifier'") as refused:
        InferenceClient(model=f"{classifier_url}/embed").feature_extraction(TEXTS[0])
    assert refused.value.response.status_code == 424
    with pytest.raises(HfHubHTTPError, match=NOT_EMBEDDING):
        HuggingFaceEndpointEmbeddings(model=f"{classifier_url}/embed").embed_documents(TEXTS)
    api = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(APIStatusError, match=NOT_EMBEDDING) as refused:
        api.embeddings.create(input=TEXTS, model=RERANKER)
    assert refused.value.status_code == 424 and refused.value.body["code"] == "backend"


def test_tei_clients_name_a_model_by_its_url(url, classifier_url):
    """TEI's clients send no model name, only a URL: /models/{name}/<route> (and /models/{name}, the bare route)
    is <route> on that model, so each reaches every served model, not only the default."""
    from huggingface_hub import InferenceClient
    from langchain_huggingface import HuggingFaceEndpointEmbeddings
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    best = InferenceClient(model=f"{url}/models/{CLASSIFIER}").text_classification(TEXTS[0])
    expected = post(url, "/predict", {"inputs": TEXTS[0], "model": CLASSIFIER}).json()[0]
    assert (best.label, best.score) == (expected["label"], pytest.approx(expected["score"], abs=1e-6))
    info = InferenceClient(model=f"{url}/models/{RERANKER}", provider="hf-inference").get_endpoint_info()
    assert info["served_model_name"] == RERANKER and "reranker" in info["model_type"]
    rerank = {"query": TEXTS[0], "texts": TEXTS[1:]}
    assert post(url, f"/models/{RERANKER}/rerank", rerank).json() == post(
        url, "/rerank", {**rerank, "model": RERANKER}).json()
    assert post(classifier_url, f"/models/{SPLADE}/embed_sparse", {"inputs": TEXTS}).json() == post(
        classifier_url, "/embed_sparse", {"inputs": TEXTS, "model": SPLADE}).json()
    langchain = HuggingFaceEndpointEmbeddings(model=f"{url}/models/{EMBEDDER}")
    assert_same(langchain.embed_documents(TEXTS), embed(url, inputs=TEXTS))
    model = TextEmbeddingsInference(model_name=EMBEDDER, base_url=f"{url}/models/{EMBEDDER}", timeout=60)
    assert_same(model.get_text_embedding_batch(TEXTS), embed(url, inputs=TEXTS))
    openai_shape = post(url, f"/models/{EMBEDDER}/v1/embeddings", {"input": TEXTS[0], "model": EMBEDDER})
    assert openai_shape.status_code == 200 and openai_shape.json()["model"] == EMBEDDER


def test_a_model_url_names_a_served_model_and_agrees_with_the_body(url):
    """An unknown name in the URL is a 404 listing the served models; a body naming another model than the URL
    is a 422."""
    unknown = post(url, "/models/nope/embed", {"inputs": TEXTS[0]})
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"] and EMBEDDER in unknown.json()["error"]
    both = post(url, f"/models/{EMBEDDER}/rerank", {"query": TEXTS[0], "texts": TEXTS[1:], "model": RERANKER})
    assert both.status_code == 422 and EMBEDDER in both.json()["error"] and RERANKER in both.json()["error"]


# --- prompt_name on every route TEI takes it on -------------------------------------------------------------


def test_prompt_name_is_taken_on_every_route_tei_takes_it_on(url):
    """TEI takes prompt_name on /embed, /similarity (in `parameters`), /tokenize, /embed_all and /embed_sparse; ours
    on /v1/embeddings too. Each puts the prompt's text before each input (never "Input should be None")."""
    plain = [f"passage: {t}" for t in TEXTS]
    assert_same(embed(url, inputs=TEXTS, prompt_name="doc"), embed(url, inputs=plain, instruction=""))
    similarity = post(url, "/similarity", {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]},
                                           "parameters": {"prompt_name": "doc"}})
    expected = post(url, "/similarity", {"inputs": {"source_sentence": plain[0], "sentences": plain[1:]},
                                         "instruction": ""})
    assert similarity.status_code == 200 and similarity.json() == pytest.approx(expected.json(), abs=1e-6)
    tokens = post(url, "/tokenize", {"inputs": TEXTS[0], "prompt_name": "doc"}).json()
    assert [t["id"] for t in tokens[0]] == [t["id"] for t in post(
        url, "/tokenize", {"inputs": plain[0], "instruction": ""}).json()[0]]
    openai = post(url, "/v1/embeddings", {"input": TEXTS, "model": EMBEDDER, "prompt_name": "doc",
                                          "encoding_format": "float"})
    assert_same([d["embedding"] for d in openai.json()["data"]], embed(url, inputs=plain, instruction=""))
    if "/embed_all" in httpx.get(f"{url}/openapi.json").json()["paths"]:
        states = post(url, "/embed_all", {"inputs": TEXTS[0], "prompt_name": "doc"})
        assert states.status_code == 200, states.text
        assert len(states.json()[0]) == len(tokens[0])  # one state per token of the prompted text
    unknown = post(url, "/embed", {"inputs": TEXTS[0], "prompt_name": "nope"})
    assert unknown.status_code == 422 and "'doc'" in unknown.json()["error"]
