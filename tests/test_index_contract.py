"""The VectorIndex contract, run on every implementation and index type.

`IMPLEMENTATIONS` maps a name to a factory (tmp_path → index) and a `settle` (index, name) that
brings background structures up to date, so ANN paths are exercised, not only the exact tail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.index import (
    CollectionExists,
    CollectionNotFound,
    CollectionSpec,
    Document,
    InvalidRequest,
    LocalIndex,
    ModelStamp,
    SearchParams,
)

DIM = 8


def _local_settle(index, name):
    index._collections[name].vectors.build_now()


def _milvus(tmp_path):
    from service.index.milvus import MilvusIndex

    return MilvusIndex(str(tmp_path / "milvus.db"))  # Milvus Lite: an embedded server on a local file


IMPLEMENTATIONS = {
    "local": (lambda tmp_path: LocalIndex(tmp_path / "index", background=False), _local_settle),
    "milvus": (_milvus, lambda index, name: index.flush(name)),  # flush: segments get their index
}
# IVF4,PQ4x4 needs 624 vectors to train: the contract runs its exact stage, test_index_local trains it.
INDEX_TYPES = ["Flat", "HNSW16", "IVF4,SQ8", "IVF4,PQ4x4"]


@pytest.fixture(autouse=True)
def _hnsw_reads_back(monkeypatch):
    """Local HNSW: the slot array gives up every row the structure holds, however few, so reads of
    covered slots (filtered exact search, vectors, deletes, rebuilds) come from the structure."""
    monkeypatch.setattr("service.index.vectors.TRIM_MIN", 1)


@pytest.fixture(params=[(impl, t) for impl in IMPLEMENTATIONS for t in INDEX_TYPES],
                ids=lambda p: f"{p[0]}-{p[1]}")
def store(request, tmp_path):
    impl, index_type = request.param
    make, settle = IMPLEMENTATIONS[impl]
    index = make(tmp_path)
    index.create_collection(CollectionSpec("docs", DIM, index_type, ModelStamp("m", "ab" * 32)))
    yield Store(index, "docs", lambda: settle(index, "docs"), index_type)
    index.close()


class Store:
    def __init__(self, index, name, settle, index_type):
        self.index, self.name, self.settle, self.index_type = index, name, settle, index_type

    def upsert(self, docs, vectors):
        return self.index.upsert(self.name, docs, unit(vectors))

    def search(self, query, **params):
        return self.index.search(self.name, unit(np.atleast_2d(query)), SearchParams(**params))[0]


def unit(rows):
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def corpus(n, seed=0):
    rng = np.random.default_rng(seed)
    vectors = unit(rng.normal(size=(n, DIM)))
    docs = [Document(f"d{i}", f"text {i}", {"i": i, "even": i % 2 == 0, "group": f"g{i % 7}",
                                              "nested": {"k": i % 3}}) for i in range(n)]
    return docs, vectors


def test_upsert_replaces_and_reports_durable_sequence(store):
    docs, vectors = corpus(400)
    first = store.upsert(docs, vectors)
    assert (first.count, first.total) == (400, 400)
    again = store.upsert([Document("d0", "new text", {"v": 2})], -vectors[:1])
    assert again.total == 400 and again.sequence > first.sequence
    store.settle()
    assert [(r.text, r.metadata) for r in store.index.get("docs", ["d0"])] == [("new text", {"v": 2})]
    hits = store.search(-vectors[0], k=1)
    assert hits[0].id == "d0" and hits[0].score == pytest.approx(1.0, abs=0.05)
    assert store.index.info("docs").count == 400


def test_get_keeps_order_skips_unknown_and_returns_vectors(store):
    docs, vectors = corpus(5)
    store.upsert(docs, vectors)
    records = store.index.get("docs", ["d3", "missing", "d1"], with_vector=True)
    assert [r.id for r in records] == ["d3", "d1"]
    assert np.allclose(records[0].vector, vectors[3], atol=1e-6)
    assert store.index.get("docs", ["d3"])[0].vector is None


def test_delete_by_ids_and_by_filter_on_a_built_structure(store):
    docs, vectors = corpus(400)
    store.upsert(docs, vectors)
    store.settle()
    assert store.index.delete("docs", ids=["d0", "d1", "nope"]).count == 2
    result = store.index.delete("docs", filter={"group": "g3"})
    assert result.count == sum(1 for i in range(2, 400) if i % 7 == 3) and result.total == 398 - result.count
    for i in (0, 1, 3):
        hits = store.search(vectors[i], k=20)
        assert f"d{i}" not in {h.id for h in hits}
        assert all(h.metadata["group"] != "g3" for h in hits)
    with pytest.raises(InvalidRequest):
        store.index.delete("docs", ids=["d5"], filter={"i": 5})
    with pytest.raises(InvalidRequest):
        store.index.delete("docs")


def test_exact_ranking_and_bounded_parameters(store):
    docs, vectors = corpus(300)
    store.upsert(docs, vectors)
    store.settle()
    query = unit(np.random.default_rng(1).normal(size=(1, DIM)))[0]
    hits = store.search(query, k=10)
    assert len(hits) == 10 and [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    exact = [f"d{i}" for i in np.argsort(-(vectors @ query))[:10]]
    overlap = len({h.id for h in hits} & set(exact))
    assert overlap == 10 if store.index_type == "Flat" else overlap >= 6
    with pytest.raises(InvalidRequest):
        store.search(query, k=0)
    if store.index_type.startswith("HNSW"):
        with pytest.raises(InvalidRequest):
            store.search(query, k=10, ef_search=5)
        assert len(store.search(query, k=10, ef_search=200)) == 10
    if store.index_type.startswith("IVF"):
        with pytest.raises(InvalidRequest):
            store.search(query, k=10, nprobe=5)
        assert len(store.search(query, k=10, nprobe=4)) == 10


@pytest.mark.parametrize("matching", [7, 150])
def test_a_filter_applies_before_ranking_and_is_never_short(store, matching):
    docs, vectors = corpus(300)
    store.upsert(docs, vectors)
    store.settle()
    flt = {"i": {"$lt": matching}}
    for q in vectors[-3:]:
        hits = store.search(q, k=10, filter=flt)
        assert len(hits) == min(10, matching)
        assert all(h.metadata["i"] < matching for h in hits)
        if matching <= 10 or store.index_type == "Flat":
            allowed = np.arange(matching)
            best = allowed[np.argsort(-(vectors[allowed] @ q))][:10]
            assert [h.id for h in hits] == [f"d{i}" for i in best]


FILTER_CASES = [
    ({"group": "g1"}, lambda m: m["group"] == "g1"),
    ({"group": {"$ne": "g1"}}, lambda m: m["group"] != "g1"),
    ({"i": {"$gt": 10, "$lte": 20}}, lambda m: 10 < m["i"] <= 20),
    ({"i": {"$gte": 5, "$lt": 9}}, lambda m: 5 <= m["i"] < 9),
    ({"i": {"$in": [1, 2, 30]}}, lambda m: m["i"] in (1, 2, 30)),
    ({"group": {"$nin": ["g1", "g2"]}}, lambda m: m["group"] not in ("g1", "g2")),
    ({"even": True}, lambda m: m["even"] is True),
    ({"nested.k": 2}, lambda m: m["nested"]["k"] == 2),
    ({"$or": [{"i": 3}, {"group": "g5"}]}, lambda m: m["i"] == 3 or m["group"] == "g5"),
    ({"$and": [{"even": False}, {"i": {"$lt": 10}}], "group": {"$ne": "g0"}},
     lambda m: not m["even"] and m["i"] < 10 and m["group"] != "g0"),
]


@pytest.mark.parametrize("flt,expected", FILTER_CASES, ids=[str(f) for f, _ in FILTER_CASES])
def test_filter_semantics(store, flt, expected):
    docs, vectors = corpus(40)
    store.upsert(docs, vectors)
    hits = store.search(vectors[0], k=40, filter=flt)
    assert sorted(h.id for h in hits) == sorted(d.id for d in docs if expected(d.metadata))


def test_values_compare_by_json_type_and_missing_fields(store):
    docs = [Document("t", "", {"x": True}), Document("one", "", {"x": 1}), Document("s", "", {"x": "1"}),
            Document("none", "", {})]
    store.upsert(docs, np.eye(4, DIM))

    def ids(flt):
        return sorted(h.id for h in store.search(np.ones(DIM), k=10, filter=flt))

    assert ids({"x": 1}) == ["one"]
    assert ids({"x": True}) == ["t"]
    assert ids({"x": "1"}) == ["s"]
    assert ids({"x": {"$ne": 1}}) == ["none", "s", "t"]
    assert ids({"x": {"$nin": [1, "1"]}}) == ["none", "t"]
    assert ids({"x": {"$gte": 1}}) == ["one"]


@pytest.mark.parametrize("bad", [{"i": {"$regex": "x"}}, {"$not": {"i": 1}}, {"i": {"$gt": "a"}},
                                 {"i": {"$in": []}}, {"$or": []}, {"i": {"$eq": [1]}}, [], {"": 1}])
def test_invalid_filters_are_refused(store, bad):
    store.upsert(*corpus(3))
    with pytest.raises(InvalidRequest):
        store.search(np.ones(DIM), k=3, filter=bad)


def test_score_threshold_and_returned_fields(store):
    docs, vectors = corpus(50)
    store.upsert(docs, vectors)
    hits = store.search(vectors[0], k=50, score_threshold=0.5)
    assert hits and all(h.score >= 0.5 for h in hits)
    assert len(hits) == int(((vectors @ vectors[0]) >= 0.5 - 1e-6).sum()) or store.index_type != "Flat"
    bare = store.search(vectors[0], k=1, with_text=False, with_metadata=False, with_vector=True)[0]
    assert (bare.id, bare.text, bare.metadata) == ("d0", None, None)
    assert np.allclose(bare.vector, vectors[0], atol=0.05)


def test_wrong_dimension_and_non_finite_vectors_are_refused_without_side_effects(store):
    with pytest.raises(InvalidRequest, match="shape"):
        store.index.upsert("docs", [Document("a")], np.ones((1, DIM + 1), np.float32))
    bad = np.ones((1, DIM), np.float32)
    bad[0, 3] = math.nan
    with pytest.raises(InvalidRequest, match="finite"):
        store.index.upsert("docs", [Document("a")], bad)
    with pytest.raises(InvalidRequest):
        store.index.search("docs", np.ones((1, DIM + 2), np.float32), SearchParams(k=1))
    assert store.index.info("docs").count == 0


@pytest.mark.parametrize("doc", [
    Document("../../etc/passwd"), Document(".."), Document("a/b"), Document(""), Document("x" * 300),
    Document("ok", metadata={"a": float("nan")}), Document("ok", metadata={"$where": 1}),
    Document("ok", metadata={"k": {"k": {"k": {"k": {"k": {"k": {"k": {"k": {"k": 1}}}}}}}}}),
    Document("ok", metadata={f"k{i}": i for i in range(300)}), Document("ok", metadata={"big": "x" * 20_000}),
])
def test_ids_and_metadata_that_could_break_later_reads_are_refused(store, doc):
    with pytest.raises(InvalidRequest):
        store.index.upsert("docs", [doc], np.ones((1, DIM), np.float32))
    assert store.index.info("docs").count == 0


def test_duplicate_ids_in_one_write_are_refused(store):
    with pytest.raises(InvalidRequest, match="twice"):
        store.upsert([Document("a"), Document("a")], np.ones((2, DIM)))


def test_collections_lifecycle(store):
    index = store.index
    with pytest.raises(CollectionExists):
        index.create_collection(CollectionSpec("docs", DIM))
    assert index.create_collection(CollectionSpec("docs", DIM), exist_ok=True).name == "docs"
    index.create_collection(CollectionSpec("other", 3))
    assert {c.name for c in index.list_collections()} >= {"docs", "other"}
    info = index.info("docs")
    assert (info.dimension, info.index_type, info.model) == (DIM, store.index_type, ModelStamp("m", "ab" * 32))
    dropped = index.drop_collection("other")
    assert dropped.sequence > info.sequence
    with pytest.raises(CollectionNotFound):
        index.info("other")
    with pytest.raises(CollectionNotFound):
        index.upsert("other", [Document("a")], np.ones((1, 3), np.float32))
    for bad in ("", "1abc", "a-b", "a/b", "x" * 80):
        with pytest.raises(InvalidRequest):
            index.create_collection(CollectionSpec(bad, 3))


def test_clear_and_scan(store):
    docs, vectors = corpus(30)
    store.upsert(docs, vectors)
    scanned = [r.id for batch in store.index.scan("docs", batch=7) for r in batch]
    assert sorted(scanned) == sorted(d.id for d in docs)
    result = store.index.clear("docs")
    assert (result.count, result.total) == (30, 0)
    assert store.search(vectors[0], k=5) == []


def test_writes_after_the_structure_is_built_are_found(store):
    docs, vectors = corpus(400)
    store.upsert(docs[:350], vectors[:350])
    store.settle()
    store.upsert(docs[350:], vectors[350:])  # not settled: the exact tail must find them
    for i in (355, 399):
        assert store.search(vectors[i], k=1)[0].id == f"d{i}"


def test_replace_collection_swaps_atomically(store):
    docs, vectors = corpus(20)
    store.upsert(docs, vectors)
    new_model = ModelStamp("m2", "cd" * 32)
    batches = [(docs[:10], -vectors[:10]), (docs[10:], -vectors[10:])]
    store.index.replace_collection(CollectionSpec("docs", DIM, store.index_type, new_model), batches)
    info = store.index.info("docs")
    assert (info.count, info.model) == (20, new_model)
    assert store.search(-vectors[4], k=1)[0].id == "d4"
    assert [c.name for c in store.index.list_collections()] == ["docs"]


@pytest.mark.parametrize("index_type", ["HNSW16", "IVF4,SQ8"])
def test_structure_search_skips_tombstones_and_slots_newer_than_the_search(index_type):
    """The ANN path counts tombstones from the builder's bookkeeping (no O(n) pass over the live flags
    per query) and leaves out slots the builder covered after the search read the slot count: their
    documents may not be stored yet (VectorSet.append runs before Collection stores the documents)."""
    from service.index.vectors import VectorSet

    vs = VectorSet(DIM, index_type, background=False)
    vectors = unit(np.random.default_rng(2).normal(size=(400, DIM)))
    vs.append(vectors[:300])
    vs.build_now()
    assert vs._dead_covered == 0
    vs.kill(np.array([0, 1, 2], dtype=np.int64))
    assert vs._dead_covered == 3
    scores, slots = vs.search(vectors[:3], k=5)
    assert not set(slots.ravel().tolist()) & {0, 1, 2} and (slots >= 0).all()
    vs.append(vectors[300:])
    vs.build_now()
    with vs._ann_lock:  # as a search that read n = 300 before the builder covered slots 300..399
        scores, slots = vs._ann_search(vectors[300:310], 10, 300, None, None, None)
    assert (slots < 300).all() and np.isneginf(scores[slots < 0]).all()
    scores, slots = vs.search(vectors[300:310], k=1)  # a search now sees them
    assert slots[:, 0].tolist() == list(range(300, 310)) or index_type.startswith("IVF")
    vs.close()


def test_a_repeated_filter_sees_every_write_since(store):
    docs, vectors = corpus(50)
    store.upsert(docs, vectors)
    flt = {"group": "g2"}
    before = {h.id for h in store.search(vectors[0], k=50, filter=flt)}
    store.upsert([Document("new", "", {"group": "g2"})], vectors[:1])
    store.index.delete("docs", ids=["d2"])
    after = {h.id for h in store.search(vectors[0], k=50, filter=flt)}
    assert after == (before | {"new"}) - {"d2"}
