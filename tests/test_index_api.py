"""The index over real HTTP (fake backend): collections, documents, search, hostile input, model stamps."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from service.api.registry import ModelRegistry
from service.engine.backends.fake import FakeBackend
from service.engine.core import Engine
from service.settings import Settings
from tests.conftest import LiveServer, until

ADMIN = {"authorization": "Bearer admin-key"}


def make_server(tmp_path, model="v1", **settings):
    registry = ModelRegistry()
    registry.add_in_process("main", Engine(FakeBackend(name=model)))
    settings = Settings(backend="fake", admin_api_keys="admin-key", models_root=tmp_path / "models",
                        index_path=tmp_path / "index", **settings)
    live = LiveServer(settings, registry)
    live.registry = registry
    return live


@pytest.fixture
def server(tmp_path):
    with make_server(tmp_path) as live:
        with httpx.Client(base_url=live.url, timeout=30) as client:
            live.client = client
            yield live


DOCS = [{"id": "guitar", "text": "a man plays the guitar", "metadata": {"lang": "en", "year": 2020}},
        {"id": "piano", "text": "a woman plays the piano", "metadata": {"lang": "en", "year": 2023}},
        {"id": "stocks", "text": "stocks fell on monday", "metadata": {"lang": "de", "year": 2023}}]


def test_the_first_routes_keep_their_answers(server):
    c = server.client
    added = c.post("/index/documents", json={"documents": DOCS}).json()
    assert (added["added"], added["total"]) == (3, 3) and added["sequence"] > 0
    hits = c.post("/search", json={"query": "a man plays the guitar", "k": 2}).json()["results"][0]
    # start and end (issue 41): the span of the best chunk, the whole text for a short document
    assert hits[0]["id"] == "guitar" and set(hits[0]) == {"id", "score", "start", "end", "text", "metadata"}
    assert (hits[0]["start"], hits[0]["end"]) == (0, len(DOCS[0]["text"]))
    assert c.delete("/index/documents/guitar").json()["deleted"] == 1
    assert c.delete("/index/documents/guitar").status_code == 404
    assert c.delete("/index").status_code == 422  # what a normalised DELETE /index/documents/.. becomes
    assert c.get("/collections/default").json()["count"] == 2
    cleared = c.delete("/index", params={"confirm": "true"}).json()
    assert (cleared["deleted"], cleared["total"]) == (2, 0)


def test_the_index_size_metric_counts_every_collection(server):
    from tests.test_processes import index_sizes

    c = server.client
    c.post("/index/documents", json={"documents": DOCS})
    c.post("/collections", json={"name": "papers"})
    assert index_sizes(c.get("/metrics").text) == {"default": 3, "papers": 0}
    c.post("/collections/papers/documents", json={"documents": DOCS[:2]})
    c.delete("/index/documents/stocks")
    assert index_sizes(c.get("/metrics").text) == {"default": 2, "papers": 2}
    c.delete("/collections/papers", params={"confirm": "true"})
    assert index_sizes(c.get("/metrics").text) == {"default": 2, "papers": 0}  # a dropped one reads 0


def test_an_api_process_starting_counts_the_collections_already_there(tmp_path):
    from tests.test_processes import index_sizes

    with make_server(tmp_path) as live:
        httpx.post(live.url + "/collections", json={"name": "notes"})
        httpx.post(live.url + "/collections/notes/documents", json={"documents": DOCS})
    with make_server(tmp_path) as live:  # the same index directory, a fresh process's metrics
        assert index_sizes(httpx.get(live.url + "/metrics").text) == {"default": 0, "notes": 3}


def test_collections_documents_and_filtered_search(server):
    c = server.client
    r = c.post("/collections", json={"name": "papers", "index_type": "HNSW16"})
    assert r.status_code == 201 and r.json()["model"]["name"] == "main" and r.json()["dimension"] == 8
    assert c.post("/collections", json={"name": "papers"}).status_code == 409
    assert c.post("/collections", json={"name": "bad-name"}).status_code == 422
    assert c.post("/collections", json={"name": "x", "index_type": "LSH"}).status_code == 422
    assert {x["name"] for x in c.get("/collections").json()["collections"]} == {"default", "papers"}

    assert c.post("/collections/papers/documents", json={"documents": DOCS}).json()["total"] == 3
    got = c.post("/collections/papers/documents/get", json={"ids": ["stocks", "nope"],
                                                             "include": ["metadata", "vector"]}).json()
    assert got["missing"] == ["nope"] and got["documents"][0]["metadata"]["lang"] == "de"
    assert len(got["documents"][0]["vector"]) == 8 and "text" not in got["documents"][0]
    assert c.get("/collections/papers/documents/piano").json()["text"] == "a woman plays the piano"
    assert c.get("/collections/papers/documents/nope").status_code == 404

    body = {"query": "plays", "k": 10, "filter": {"lang": "en", "year": {"$gte": 2021}}}
    hits = c.post("/collections/papers/search", json=body).json()["results"][0]
    assert [h["id"] for h in hits] == ["piano"]
    assert c.post("/collections/papers/search", json={**body, "filter": {"year": {"$regex": 1}}}).status_code == 422
    assert c.post("/collections/papers/search", json={"query": "x", "ef_search": 5000}).status_code == 422

    deleted = c.post("/collections/papers/documents/delete", json={"filter": {"year": 2023}}).json()
    assert (deleted["deleted"], deleted["total"]) == (2, 1)
    stats = c.get("/collections/papers").json()
    assert stats["count"] == 1 and stats["sequence"] == deleted["sequence"] and stats["index_type"] == "HNSW16"
    assert c.delete("/collections/papers").status_code == 422
    assert c.delete("/collections/papers", params={"confirm": "true"}).status_code == 200
    assert c.get("/collections/papers").status_code == 404


def test_client_vectors_are_checked(server):
    c = server.client
    assert c.post("/collections", json={"name": "vec", "vectors_only": True}).status_code == 422
    assert c.post("/collections", json={"name": "vec", "vectors_only": True, "dimension": 3}).status_code == 201
    docs = [{"id": "a", "vector": [1, 0, 0]}, {"id": "b", "vector": [0, 2, 0], "metadata": {"k": 1}}]
    assert c.post("/collections/vec/documents", json={"documents": docs}).status_code == 200
    hits = c.post("/collections/vec/search", json={"vector": [0, 1, 0.1], "k": 1}).json()["results"][0]
    assert hits[0]["id"] == "b" and hits[0]["score"] == pytest.approx(0.995, abs=1e-3)
    for bad in ([{"id": "c", "vector": [1, 0]}], [{"id": "c", "vector": [0, 0, 0]}], [{"id": "c", "text": "x"}]):
        r = c.post("/collections/vec/documents", json={"documents": bad})
        assert r.status_code == 422 and r.json()["error_type"] == "Validation", r.text
    nan = b'{"documents": [{"id": "c", "vector": [NaN, 1, 0]}]}'
    r = c.post("/collections/vec/documents", content=nan, headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert c.post("/collections/vec/search", json={"query": "text", "k": 1}).status_code == 422
    assert c.get("/collections/vec").json()["count"] == 2


def test_hostile_ids_and_metadata_are_refused_and_nothing_stored_breaks_reads(server):
    c = server.client
    c.post("/index/documents", json={"documents": DOCS})
    nested: dict = {}
    for _ in range(400):
        nested = {"n": nested}
    deep = '{"documents": [{"id": "deep", "text": "x", "metadata": ' + json.dumps(nested) + "}]}"
    r = c.post("/index/documents", content=deep.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    for bad_id in ("../../etc/passwd", "a/b", "..", ".", "a b"):
        r = c.post("/index/documents", json={"documents": [{"id": bad_id, "text": "x"}]})
        assert r.status_code == 422 and "id" in r.json()["error"], bad_id
    # A client normalises /index/documents/.. to /index/: no route, no redirect to DELETE /index.
    for path in ("/index/documents/..", "/index/documents/../", "/index/", "/index/documents/%2e%2e",
                 "/collections/default/documents/.."):
        r = c.delete(path)
        assert r.status_code in (404, 422), (path, r.status_code)
    assert c.get("/collections/default").json()["count"] == 3
    assert len(c.post("/search", json={"query": "plays", "k": 10}).json()["results"][0]) == 3


def test_a_collection_made_by_another_model_is_refused_until_reembedded(tmp_path):
    with make_server(tmp_path, model="v1") as live:
        httpx.post(f"{live.url}/index/documents", json={"documents": DOCS}).raise_for_status()
    with make_server(tmp_path, model="v2") as live:  # the same index, another model under the same name
        c = httpx.Client(base_url=live.url, timeout=30)
        r = c.post("/search", json={"query": "plays", "k": 2})
        assert r.status_code == 409 and r.json()["error_type"] == "ModelMismatch"
        assert "/admin/collections/default/reembed" in r.json()["error"]
        assert c.post("/index/documents", json={"documents": DOCS[:1]}).status_code == 409
        assert c.post("/search", json={"vector": [1] * 8, "k": 1}).status_code == 200  # vectors need no model
        assert c.post("/admin/collections/default/reembed", json={}).status_code == 401
        r = c.post("/admin/collections/default/reembed", json={}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["count"] == 3
        stamp = c.get("/collections/default").json()["model"]
        assert stamp["sha256"] == live.registry.get().info.graph_sha256
        assert c.post("/search", json={"query": "a man plays the guitar", "k": 1}).json()["results"][0][0]["id"] \
            == "guitar"
        c.close()


def test_reload_with_reembed_keeps_search_answering(tmp_path):
    (tmp_path / "models" / "v2").mkdir(parents=True)
    with make_server(tmp_path) as live:
        async def run():
            async with httpx.AsyncClient(base_url=live.url, timeout=30) as c:
                await c.post("/index/documents", json={"documents": [
                    {"id": f"d{i}", "text": f"document number {i}"} for i in range(200)]})
                stop = asyncio.Event()
                statuses: list[int] = []

                async def searcher():
                    while not stop.is_set():
                        r = await c.post("/search", json={"query": "document number 7", "k": 3})
                        statuses.append(r.status_code)

                tasks = [asyncio.ensure_future(searcher()) for _ in range(4)]
                # the reload comes amid answered searches
                await until(lambda: len(statuses) >= 8, what="the searches to be answered")
                reloaded = await c.post("/admin/models/main/reload", json={"export": "v2", "reembed": True},
                                        headers=ADMIN)
                switched = len(statuses)
                await until(lambda: len(statuses) >= switched + 8, what="searches answered after the reload")
                stop.set()
                await asyncio.gather(*tasks)
                return reloaded, statuses, (await c.get("/collections/default")).json()

        reloaded, statuses, stats = asyncio.run(run())
        assert reloaded.status_code == 200, reloaded.text
        assert len(statuses) > 10 and set(statuses) == {200}
        assert stats["count"] == 200 and stats["model"]["sha256"] == live.registry.get("main").info.graph_sha256


def test_reembed_command_line(tmp_path, default_export):
    """The offline command re-embeds a stopped service's index with a real export."""
    from service.index import CollectionSpec, Document, LocalIndex, ModelStamp, SearchParams
    from service.offline_reembed import main

    index = LocalIndex(tmp_path / "index")
    index.create_collection(CollectionSpec("default", 384, "Flat", ModelStamp("old", "00" * 32)))
    index.upsert("default", [Document("g", "A man is playing a guitar."), Document("s", "Stocks fell.")],
                 np.eye(2, 384, dtype=np.float32))
    index.close()
    main(["--index-path", str(tmp_path / "index"), "--model-dir", str(default_export)])
    index = LocalIndex(tmp_path / "index")
    info = index.info("default")
    assert info.model.name == "all-MiniLM-L6-v2" and info.count == 2
    vectors = {r.id: np.array(r.vector) for r in index.get("default", ["g", "s"], with_vector=True)}
    assert np.linalg.norm(vectors["g"]) == pytest.approx(1.0, abs=1e-4) and abs(vectors["g"] @ vectors["s"]) < 0.5
    hit = index.search("default", vectors["g"][None].astype(np.float32), SearchParams(k=1))[0][0]
    assert hit.id == "g"
    index.close()
