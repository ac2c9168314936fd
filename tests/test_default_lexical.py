"""SEMBED_INDEX_LEXICAL: the default collection (/index/documents, /search) keeps a lexical index, and /search takes
the same `mode` and `fusion` as a collection's search (issue 41); off, modes lexical and hybrid are a 422 naming the
setting. Turned on for an index that holds documents, the lexical index is built from their texts (a log record,
so replay and snapshots keep it); turned off, it is dropped."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from service.index import DEFAULT_COLLECTION, CollectionSpec, Document, InvalidRequest, LocalIndex, SearchParams
from tests.test_index_api import make_server
from tests.test_index_lexical import DIM, TEXTS, vec

DOCUMENTS = [{"id": i, "text": t, "metadata": {"n": n}} for n, (i, t) in enumerate(TEXTS.items())]


def refused(reply: httpx.Response, *words: str) -> None:
    assert reply.status_code == 422, reply.text
    body = reply.json()
    assert body["error_type"] == "Validation" and all(w in body["error"] for w in words), body


@pytest.fixture
def lexical_service(tmp_path):
    with make_server(tmp_path, index_lexical=True) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        yield client


def test_the_default_collection_searches_lexical_and_hybrid(lexical_service):
    c = lexical_service
    assert c.get(f"/collections/{DEFAULT_COLLECTION}").json()["lexical"] is True
    assert c.post("/index/documents", json={"documents": DOCUMENTS}).json()["added"] == len(DOCUMENTS)

    def search(**body) -> httpx.Response:
        return c.post("/search", json={"query": "lazy QX9981", "k": 5, **body})

    lexical = search(mode="lexical").json()["results"][0]
    assert [h["id"] for h in lexical] == ["kinase", "dog", "fox"]  # the rare part number first; "lazy": shorter first
    assert all(h["score"] > 0 for h in lexical) and lexical[0]["text"] == TEXTS["kinase"]
    # the same scores as a lexical collection holding the same documents
    assert c.post("/collections", json={"name": "twin", "lexical": True}).status_code == 201
    c.post("/collections/twin/documents", json={"documents": DOCUMENTS})
    twin = c.post("/collections/twin/search", json={"query": "lazy QX9981", "k": 5, "mode": "lexical"}).json()
    assert [(h["id"], h["score"]) for h in twin["results"][0]] == [(h["id"], h["score"]) for h in lexical]

    dense = search().json()["results"][0]
    hybrid = search(mode="hybrid", fusion={"k": 10, "candidates": 5}).json()["results"][0]
    ranks = [{h["id"]: r for r, h in enumerate(ranking, 1)} for ranking in (dense, lexical)]
    fused = {i: sum(1 / (10 + r[i]) for r in ranks if i in r) for i in TEXTS}
    assert [h["id"] for h in hybrid] == sorted(fused, key=lambda i: (-fused[i], list(TEXTS).index(i)))
    assert np.allclose([h["score"] for h in hybrid], sorted(fused.values(), reverse=True))
    assert [h["id"] for h in search(mode="lexical", filter={"n": {"$gt": 0}}).json()["results"][0]] == ["dog", "fox"]

    assert c.delete("/index/documents/kinase").status_code == 200
    assert [h["id"] for h in search(mode="lexical").json()["results"][0]] == ["dog", "fox"]
    refused(search(mode="hybrid", fusion={"k": 0}), "k")
    refused(search(fusion={"k": 5}), "fusion applies to mode 'hybrid'")
    refused(c.post("/search", json={"vector": [1.0] * 4, "mode": "lexical"}), "give query (text), not vector")


def test_without_the_setting_lexical_and_hybrid_are_refused_by_name(tmp_path):
    with make_server(tmp_path) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        assert c.get(f"/collections/{DEFAULT_COLLECTION}").json()["lexical"] is False
        c.post("/index/documents", json={"documents": DOCUMENTS})
        for mode in ("lexical", "hybrid"):
            refused(c.post("/search", json={"query": "QX9981", "mode": mode}), "default collection",
                    "no lexical index", "SEMBED_INDEX_LEXICAL=true", f"'{mode}'")
        assert c.post("/search", json={"query": "QX9981", "mode": "dense"}).status_code == 200


def test_turned_on_it_is_built_from_the_stored_texts_and_turned_off_dropped(tmp_path):
    """Over restarts of a live service on one index folder: documents written without a lexical index are found
    by words once the setting is on (and after another restart: the log's record), and no more once it is off."""
    def lexical_ids(c: httpx.Client) -> list[str]:
        return [h["id"] for h in c.post("/search", json={"query": "lazy", "mode": "lexical"}).json()["results"][0]]

    with make_server(tmp_path) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        c.post("/index/documents", json={"documents": DOCUMENTS})
    for _ in range(2):
        with make_server(tmp_path, index_lexical=True) as live, httpx.Client(base_url=live.url, timeout=30) as c:
            assert c.get(f"/collections/{DEFAULT_COLLECTION}").json()["lexical"] is True
            assert lexical_ids(c) == ["dog", "fox"]
    with make_server(tmp_path) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        assert c.get(f"/collections/{DEFAULT_COLLECTION}").json()["lexical"] is False
        assert c.get(f"/collections/{DEFAULT_COLLECTION}").json()["count"] == len(DOCUMENTS)
        refused(c.post("/search", json={"query": "lazy", "mode": "lexical"}), "SEMBED_INDEX_LEXICAL")


def test_create_with_exist_ok_adds_or_drops_the_lexical_index_through_the_log(tmp_path):
    """The index side: an existing collection's lexical index follows `lexical` of a create with exist_ok; the
    change is a log record (replayed) and the snapshot's manifest keeps it; scores are a fresh lexical
    collection's."""
    def scores(index: LocalIndex, name: str) -> list[tuple[str, float]]:
        hits = index.search(name, None, SearchParams(k=10, mode="lexical", texts=["protein calcium lazy"]))[0]
        return [(h.id, h.score) for h in hits]

    live = [Document(i, t, {}) for i, t in TEXTS.items()]
    vectors = np.stack([vec(d.id) for d in live])
    index = LocalIndex(tmp_path / "index", background=False)
    index.create_collection(CollectionSpec("c", DIM))
    index.upsert("c", live, vectors)
    index.delete("c", ["fox"])  # a dead slot: left out of what is built
    index.create_collection(CollectionSpec("c", DIM), exist_ok=True)  # no change: no record
    sequence = index.info("c").sequence
    assert index.create_collection(CollectionSpec("c", DIM, lexical=True), exist_ok=True).lexical
    assert index.info("c").sequence == sequence + 1
    fresh = LocalIndex(background=False)
    fresh.create_collection(CollectionSpec("c", DIM, lexical=True))
    fresh.upsert("c", [d for d in live if d.id != "fox"], vectors[[i != "fox" for i in TEXTS]])
    expected = scores(fresh, "c")
    fresh.close()
    assert sorted(i for i, _ in expected) == ["calcium", "dog", "kinase", "protein"]
    assert scores(index, "c") == expected
    index.upsert("c", [Document("fox", "a lazy fox", {})], vec("fox")[None])  # written into it from now on
    assert "fox" in [i for i, _ in scores(index, "c")]
    with_fox = scores(index, "c")
    index.close()

    index = LocalIndex(tmp_path / "index", background=False)  # the log's replay
    assert index.info("c").lexical and scores(index, "c") == with_fox
    index.snapshot()
    index.close()
    index = LocalIndex(tmp_path / "index", background=False)  # the snapshot
    assert index.info("c").lexical and scores(index, "c") == with_fox
    assert not index.create_collection(CollectionSpec("c", DIM), exist_ok=True).lexical
    with pytest.raises(InvalidRequest, match="no lexical index"):
        scores(index, "c")
    index.upsert("c", [Document("dog", "a dog again", {})], vec("dog")[None])  # no lexical index to write to
    index.close()
    index = LocalIndex(tmp_path / "index", background=False)
    assert not index.info("c").lexical and index.info("c").count == len(TEXTS)
    index.close()


def test_the_milvus_backend_with_the_setting_is_refused_at_start_naming_it():
    import pydantic

    from service.settings import Settings

    with pytest.raises(pydantic.ValidationError, match="SEMBED_INDEX_LEXICAL=true needs SEMBED_INDEX_BACKEND=local"):
        Settings(index_lexical=True, index_backend="milvus", milvus_uri="/tmp/m.db")
    assert Settings(index_lexical=True).index_lexical and not Settings(index_backend="milvus").index_lexical
