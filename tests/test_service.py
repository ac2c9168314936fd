"""The service over real HTTP on the real default export: endpoints, errors, batching, metrics."""

import asyncio
import re

import httpx
import numpy as np
import pytest

GUITAR = "A man is playing a guitar."


@pytest.fixture(scope="module")
def client(live_service):
    with httpx.Client(base_url=live_service.url, timeout=60) as c:
        yield c


@pytest.fixture
def empty_index(client):
    client.delete("/index", params={"confirm": "true"})
    yield
    client.delete("/index", params={"confirm": "true"})


def test_embed_returns_unit_vectors_of_the_model_dimension(client):
    # Exactly what the README's `curl --json` sends.
    r = client.post("/embed", content=b'{"inputs":["A man is playing a guitar."]}',
                    headers={"content-type": "application/json", "accept": "application/json"})
    assert r.status_code == 200, r.text
    body = r.json()  # TEI's shape: a bare list of vectors
    assert len(body) == 1 and len(body[0]) == 384
    assert np.linalg.norm(body[0]) == pytest.approx(1.0, abs=1e-5)


def vectors(response) -> np.ndarray:
    """float32 as served: the JSON carries the shortest decimal that reads back to the same float32."""
    return np.asarray(response.json(), dtype=np.float32)


def test_embed_single_string_and_order(client, default_export):
    from service.engine.backends.onnx import OnnxBackend

    texts = ["first sentence", "B", "a third, much longer sentence than the other two"]
    batch = vectors(client.post("/embed", json={"inputs": texts}))
    single = vectors(client.post("/embed", json={"inputs": texts[1]}))
    assert batch.shape == (3, 384) and single.shape == (1, 384)
    assert np.array_equal(batch[1], single[0])  # bit for bit, batched or not
    assert np.array_equal(batch, OnnxBackend(default_export).encode(texts, batch_size=1))


def test_embed_without_normalisation(client):
    raw = np.array(client.post("/embed", json={"inputs": [GUITAR], "normalize": False}).json()[0])
    unit = np.array(client.post("/embed", json={"inputs": [GUITAR]}).json()[0])
    assert abs(np.linalg.norm(raw) - 1) > 1e-3
    assert np.abs(raw / np.linalg.norm(raw) - unit).max() < 1e-5


def test_similarity_ranks_paraphrase_above_unrelated(client):
    r = client.post("/similarity", json={"inputs": {"source_sentence": GUITAR, "sentences": [
        "A person plays the guitar.", "Stocks fell sharply on Monday."]}})
    assert r.status_code == 200
    paraphrase, unrelated = r.json()
    assert paraphrase > 0.7 and unrelated < 0.2 and paraphrase > unrelated


def test_index_then_search_returns_own_document_first(client, empty_index):
    docs = [
        {"id": "guitar", "text": GUITAR, "metadata": {"lang": "en", "n": 1}},
        {"id": "stocks", "text": "Stocks fell sharply on Monday."},
        {"id": "cat", "text": "A cat is sleeping on the sofa."},
        {"id": "rain", "text": "Heavy rain is expected tomorrow in the north."},
    ]
    r = client.post("/index/documents", json={"documents": docs})
    assert r.json()["added"] == 4 and r.json()["total"] == 4 and r.json()["sequence"] >= 1
    results = client.post("/search", json={"query": [d["text"] for d in docs], "k": 4}).json()["results"]
    for doc, hits in zip(docs, results):
        assert hits[0]["id"] == doc["id"] and hits[0]["text"] == doc["text"]
        assert hits[0]["score"] == pytest.approx(1.0, abs=1e-4)
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert results[0][0]["metadata"] == {"lang": "en", "n": 1}
    hits = client.post("/search", json={"query": "Who is making music?", "k": 2}).json()["results"]
    assert len(hits) == 1 and hits[0][0]["id"] == "guitar" and len(hits[0]) == 2


def test_readding_an_id_replaces_it_and_delete_removes_it(client, empty_index):
    client.post("/index/documents", json={"documents": [{"id": "a", "text": "The weather is sunny."}]})
    client.post("/index/documents", json={"documents": [{"id": "a", "text": "Quantum computers use qubits."}]})
    hits = client.post("/search", json={"query": "qubits", "k": 5}).json()["results"][0]
    assert [(h["id"], h["text"]) for h in hits] == [("a", "Quantum computers use qubits.")]
    deleted = client.delete("/index/documents/a").json()
    assert (deleted["deleted"], deleted["total"]) == (1, 0) and deleted["sequence"] >= 1
    assert client.delete("/index/documents/a").status_code == 404
    assert client.post("/search", json={"query": "qubits", "k": 5}).json() == {"results": [[]]}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/embed", b"{not json"),
        ("/embed", b'{"inputs": []}'),
        ("/embed", b'{"inputs": 5}'),
        ("/embed", b'{"inputs": ["ok", null]}'),
        ("/embed", b'{"input": ["misspelt field"]}'),
        ("/embed", b'[1, 2]'),
        ("/embed", b''),
        ("/similarity", b'{"inputs": {"source_sentence": "a", "sentences": []}}'),
        ("/similarity", b'{"inputs": {"sentences": ["a"]}}'),
        ("/similarity", b'{"source_sentence": "a", "sentences": ["b"]}'),
        ("/rerank", b'{"query": "a", "texts": []}'),
        ("/tokenize", b'{"inputs": 3}'),
        ("/", b'{"inputs": {"source_sentence": "a"}}'),
        ("/", b'{"inputs": []}'),
        ("/search", b'{"query": "a", "k": 0}'),
        ("/search", b'{"query": "a", "k": "ten"}'),
        ("/search", b'{"query": []}'),
        ("/search", b'{"query": "a", "k": 100000}'),
        ("/index/documents", b'{"documents": []}'),
        ("/index/documents", b'{"documents": [{"id": "", "text": "x"}]}'),
        ("/index/documents", b'{"documents": [{"id": "1"}]}'),
        ("/index/documents", b'{"documents": [{"id": "1", "text": "x"}, {"id": "1", "text": "y"}]}'),
        ("/index/documents", b'{"documents": [{"id": "1", "text": "x", "metadata": [1]}]}'),
    ],
)
def test_malformed_requests_get_422_with_a_json_error(client, path, body):
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]


def test_limits_each_get_their_status(client, live_service):
    settings = live_service.app.state.settings
    r = client.post("/embed", json={"inputs": ["x"] * (settings.max_client_batch_size + 1)})
    assert r.status_code == 422 and str(settings.max_client_batch_size) in r.json()["error"]
    r = client.post("/embed", json={"inputs": ["y" * settings.max_request_bytes]})
    assert r.status_code == 413 and "bytes" in r.json()["error"]
    long = "word " * 600
    r = client.post("/embed", json={"inputs": ["short", long], "truncate": False})
    assert r.status_code == 422 and "inputs[1] has 602 tokens" in r.json()["error"] and "256" in r.json()["error"]
    truncated = client.post("/embed", json={"inputs": [long]})  # auto_truncate: cut to 256 tokens
    assert truncated.status_code == 200 and truncated.headers["x-compute-tokens"] == "256"


SURROGATE = rb'"bad \ud800 text"'  # JSON's escape for a lone UTF-16 surrogate


@pytest.mark.parametrize(("path", "body"), [
    ("/embed", b'{"inputs": ["fine", %s]}'),
    ("/similarity", b'{"inputs": {"source_sentence": %s, "sentences": ["fine"]}}'),
    ("/rerank", b'{"query": "q", "texts": ["fine", %s]}'),
    ("/tokenize", b'{"inputs": %s}'),
    ("/", b'{"inputs": %s}'),
    ("/search", b'{"query": %s}'),
    ("/index/documents", b'{"documents": [{"id": "x", "text": %s}]}'),
    ("/v1/embeddings", b'{"input": [%s]}'),
    ("/embed", b'{"inputs": ["fine", %s], "chunking": true}'),  # the splitter meets the text first
    ("/v1/embeddings", b'{"input": [%s], "chunking": {"size": 64}}'),
])
def test_a_lone_surrogate_is_422_on_every_route(client, empty_index, path, body):
    r = client.post(path, content=body % SURROGATE, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "not valid Unicode" in r.text
    assert client.get("/info").json()["index_documents"] == 0  # a failed write adds nothing


def test_a_bad_input_fails_alone_among_concurrent_requests(live_service):
    texts = [f"an ordinary sentence number {i}" for i in range(16)]

    async def run():
        async with httpx.AsyncClient(base_url=live_service.url, timeout=60) as c:
            bad = b'{"inputs": [%s]}' % SURROGATE
            good = [c.post("/embed", json={"inputs": [t]}) for t in texts]
            hostile = [c.post("/embed", content=bad, headers={"content-type": "application/json"}) for _ in range(4)]
            return await asyncio.gather(*good, *hostile)

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 16 + [422] * 4


def test_unknown_route_and_method(client):
    assert client.get("/nope").status_code == 404
    assert client.get("/nope").json()["error"]
    assert client.get("/embed").status_code == 405


def test_ops_endpoints(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    assert client.get("/health").json() == {"status": "ok"}  # a real forward pass
    raw = client.get("/info")
    info = raw.json()
    assert info["manifest"]["dimension"] == 384 and info["manifest"]["max_seq_length"] == 256
    assert len(raw.content) < 4096 and "golden" not in raw.text  # polled by clients: small
    assert "ranges" not in raw.text and 384 in info["manifest"]["calibration"]["dimensions"]  # int8 output: which
    client.post("/embed", json={"inputs": ["count me"]})
    text = client.get("/metrics").text
    assert 'sembed_requests_total{route="/embed",status="200"}' in text
    assert "sembed_batch_size_bucket" in text and "sembed_embedded_texts_total" in text
    assert 'sembed_model_info{device="cpu",dimension="384",max_seq_length="256",model="all-MiniLM-L6-v2"' in text
    for name in ("sembed_tokenization_duration_seconds", "sembed_queue_duration_seconds", "sembed_batch_tokens",
                 "sembed_input_length_tokens", "sembed_queue_size"):
        assert name in text, name
    client.post("/embed", json={"inputs": []})
    assert 'sembed_request_errors_total{error_type="Validation",route="/embed"}' in client.get("/metrics").text


def test_openapi_documents_every_endpoint(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/embed", "/similarity", "/rerank", "/tokenize", "/", "/search", "/index/documents", "/healthz",
                 "/readyz", "/metrics", "/info", "/health", "/v1/embeddings", "/v1/models"):
        assert path in paths
    assert "EmbedRequest" in str(paths["/embed"])


def test_concurrent_requests_share_batches_and_keep_their_rows(live_service):
    texts = [f"sentence number {i} about topic {i % 7}" for i in range(48)]

    async def run():
        async with httpx.AsyncClient(base_url=live_service.url, timeout=60) as c:
            before = _histogram_count(await c.get("/metrics"))
            rs = await asyncio.gather(*(c.post("/embed", json={"inputs": [t]}) for t in texts))
            after = _histogram_count(await c.get("/metrics"))
            return [r.json()[0] for r in rs], after - before

    got, forward_passes = asyncio.run(run())
    alone = [vectors(httpx.post(f"{live_service.url}/embed", json={"inputs": [t]}, timeout=60))[0] for t in texts]
    # every response got its own row back, with the same bits as the text sent on its own
    assert np.array_equal(np.asarray(got, dtype=np.float32), np.stack(alone))
    assert forward_passes < len(texts)  # and requests were batched together


def _histogram_count(response) -> int:
    for line in response.text.splitlines():
        if line.startswith("sembed_batch_size_count"):
            return int(float(line.split()[-1]))
    raise AssertionError("no batch size histogram")


def test_docs_work_offline(client):
    """Swagger UI's page and assets come from this server (a package ships them), not from a CDN."""
    page = client.get("/docs")
    assert page.status_code == 200 and "cdn" not in page.text.lower()
    assets = re.findall(r'(?:src|href)="(/docs-assets/[^"]+)"', page.text)
    assert len(assets) == 2
    for asset in assets:
        served = client.get(asset)
        assert served.status_code == 200 and len(served.content) > 10_000, asset
    assert client.get("/openapi.json").json()["info"]["title"] == "sembed"
