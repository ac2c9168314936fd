"""End to end against the real app: the harness over REST agrees with the same export in process."""

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from core import beir
from evaluation.embedders import HttpClient, OnnxEmbedder, ServiceEmbedder, ServiceError, load_embedder
from evaluation.retrieval import search_in_process, search_service
from evaluation.sts import evaluate_sts

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
TINY = FIXTURES / "beir-tiny"


@pytest.fixture(scope="module")
def in_process(default_export):
    return OnnxEmbedder(default_export)


def test_sts_over_rest_agrees_with_in_process(live_service, in_process):
    service = load_embedder(url=live_service.url)
    assert isinstance(service, ServiceEmbedder) and service.name == in_process.name
    tasks = ("STS12", "STSBenchmark", "SICKRelatedness")
    over_http = evaluate_sts(service, data_dir=FIXTURES, tasks=tasks)
    local = evaluate_sts(in_process, data_dir=FIXTURES, tasks=tasks)
    for name in local:
        assert abs(over_http[name] - local[name]) < 0.01, name
    assert local["STS12"] > 50  # the real model orders the fixture pairs sensibly


def test_embedding_requests_are_chunked_to_the_service_limit(live_service, in_process):
    limit = live_service.app.state.settings.max_client_batch_size
    texts = [f"sentence number {i}" for i in range(limit + 9)]
    embedder = ServiceEmbedder(live_service.url, chunk=10_000)  # asks for more than the service takes
    assert embedder.client.chunk == limit
    got = embedder.encode(texts)
    assert got.shape == (limit + 9, 384)
    assert np.abs(got - in_process.encode(texts)).max() < 1e-5


def test_retrieval_through_the_service_index(live_service, in_process, tmp_path):
    data = beir.load(TINY)
    # something already in the index is cleared first...
    httpx.post(f"{live_service.url}/index/documents", json={"documents": [{"id": "stray", "text": "A guitar."}]})
    over_http = search_service(live_service.url, data, depth=4)
    local = search_in_process(in_process, data, depth=4)
    assert live_service.app.state.index.info("default").count == len(data.corpus)
    assert "q1" not in over_http["q1"]  # a query that is also a document does not find itself
    for q in data.queries:
        assert "stray" not in over_http[q]
        assert list(over_http[q]) == list(local[q])
        assert np.allclose(list(over_http[q].values()), list(local[q].values()), atol=1e-5)
    # ...unless --keep-index: then it competes like any document
    from evaluation.retrieval import main

    httpx.post(f"{live_service.url}/index/documents", json={"documents": [{"id": "stray", "text": "A guitar."}]})
    out = tmp_path / "r.json"
    assert main(["--url", live_service.url, "--data", str(TINY), "--keep-index", "--out", str(out)]) == 0
    assert live_service.app.state.index.info("default").count == len(data.corpus) + 1
    record = json.loads(out.read_text())
    assert record["label"] == f"{in_process.name} (service)" and record["documents"] == 6
    assert record["protocol"]["ignore_identical_ids"] is True
    assert record["retrieval"]["MRR@10"] == pytest.approx(1.0)


def test_ecosystem_adapters_call_the_service(live_service, in_process):
    from evaluation.adapters import BeirServiceModel, MtebServiceEncoder

    expected = in_process.encode(["Music Someone plays.", "query text", "Someone plays."])
    model = BeirServiceModel(live_service.url)
    documents = [{"title": "Music", "text": "Someone plays."}, {"title": "", "text": "Someone plays."}]
    corpus = model.encode_corpus(documents, batch_size=8)
    assert np.abs(corpus - expected[[0, 2]]).max() < 1e-5
    assert np.abs(model.encode_corpus({"title": ["Music"], "text": ["Someone plays."]}) - expected[0]).max() < 1e-5
    assert np.abs(model.encode_queries(["query text"], batch_size=8) - expected[1]).max() < 1e-5
    mteb = MtebServiceEncoder(live_service.url)
    batches = mteb.encode([{"text": ["query text", "Someone plays."]}], task_metadata=None, prompt_type=None)
    assert np.abs(batches - expected[[1, 2]]).max() < 1e-5
    sim = mteb.similarity(batches, batches)
    assert sim.shape == (2, 2) and np.allclose(np.diag(sim), 1.0, atol=1e-5)
    assert np.allclose(mteb.similarity_pairwise(batches, batches[::-1]), sim[0, 1], atol=1e-6)


def test_service_errors_are_reported(live_service):
    with pytest.raises(ServiceError, match="HTTP 422"):
        HttpClient(live_service.url).request("POST", "/embed", {"inputs": []})
    too_big = {"inputs": ["x" * (live_service.app.state.settings.max_request_bytes + 1)]}
    with pytest.raises(ServiceError, match="HTTP 413"):
        HttpClient(live_service.url).request("POST", "/embed", too_big)
    with pytest.raises(ServiceError, match="cannot reach"):
        HttpClient("http://127.0.0.1:9", retries=1, backoff=0.01).request("GET", "/info")
