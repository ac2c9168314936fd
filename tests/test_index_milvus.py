"""MilvusIndex beyond the shared contract (tests/test_index_contract.py): the filter translation and
its escaping, what Milvus Lite makes of it, persistence across reopening a Lite file, rebuilds, and
several clients on one store (replicas). One Lite server per module, a fresh collection per test."""

from __future__ import annotations

import itertools
import subprocess
import sys
import uuid

import numpy as np
import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from service.index import CollectionExists, CollectionSpec, Document, InvalidRequest, ModelStamp, SearchParams  # noqa: E402
from service.index import milvus as mv  # noqa: E402
from service.index.filters import compile_filter  # noqa: E402
from service.index.milvus import MilvusIndex, quote, to_expression  # noqa: E402

DIM = 4
EVIL = [
    '" or true or "',
    'x"] == 1 or metadata["a',
    '\\" or 1 == 1 or \\"',
    "' or '1' == '1",
    "a\\",
    'line\nbreak " || id != "',
    "tab\tand\rreturn",
    "ünïcødé ✓ \U0001f600",
    ") or (true",
]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    store = MilvusIndex(str(tmp_path_factory.mktemp("milvus") / "shared.db"))
    yield store
    store.close()


@pytest.fixture
def name(index):
    name = "t" + uuid.uuid4().hex[:12]
    index.create_collection(CollectionSpec(name, DIM))
    yield name
    index.drop_collection(name)


def unit(rows):
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


# the translation, without a server -----------------------------------------------------------------

def test_values_are_quoted_and_escaped():
    assert quote('a"b') == '"a\\"b"'
    assert quote("a\\b") == '"a\\\\b"'
    assert quote("a\nb\tc\rd") == '"a\\nb\\tc\\rd"'
    assert quote("nul\x00") is None and quote("bell\x07") is None
    assert to_expression({"lang": "en"}) == 'metadata["lang"] == "en"'
    assert to_expression({"lang": 'e"n'}) == 'metadata["lang"] == "e\\"n"'
    for evil in EVIL:
        expr = to_expression({"k": evil})
        if expr is not None:  # one string literal: the only quote characters left are escaped ones
            body = expr[len('metadata["k"] == "'):-1]
            assert expr.startswith('metadata["k"] == "') and expr.endswith('"')
            assert all(body[i - 1] == "\\" for i, c in enumerate(body) if c == '"')


def test_only_a_superset_is_pushed_down():
    assert to_expression(None) is None
    assert to_expression({"a.b": 1}) == 'metadata["a"]["b"] == 1'
    assert to_expression({"x": True}) == 'metadata["x"] == true'
    assert to_expression({"x": None}) == 'metadata["x"] is null'
    assert to_expression({"x": 2.0}) == 'metadata["x"] == 2'
    assert to_expression({"x": {"$gt": 1, "$lt": 2.5}}) == '(metadata["x"] >= 1 and metadata["x"] <= 2.5)'
    assert to_expression({"x": {"$in": ["a", 1]}}) == '(metadata["x"] == "a" or metadata["x"] == 1)'
    # left to the exact predicate: negations, unsafe keys, numbers beyond 2**53, an $or with such a branch
    assert to_expression({"x": {"$ne": 1}}) is None
    assert to_expression({"x": {"$nin": [1]}}) is None
    assert to_expression({'we"ird': 1}) is None and to_expression({"a b": 1}) is None
    assert to_expression({"x": 2**60}) is None and to_expression({"x": {"$gt": 1e300}}) is None
    assert to_expression({"$or": [{"x": 1}, {"y": {"$ne": 2}}]}) is None
    assert to_expression({"$and": [{"x": 1}, {"y": {"$ne": 2}}]}) == 'metadata["x"] == 1'
    assert to_expression({"x": {"$in": list(range(mv.MAX_PUSHDOWN_IN + 1))}}) is None


@pytest.mark.parametrize("bad", [{"i": {"$regex": "x"}}, {"$where": "1"}, {"i": {"$gt": "a"}}, [], {"": 1}])
def test_bad_filters_are_refused_before_translation(bad):
    with pytest.raises(InvalidRequest):
        to_expression(bad)


# on Milvus Lite --------------------------------------------------------------------------------------

VALUES = [1, 1.0, 2, -3, 0.1, 2**62, True, False, None, "1", "a", "", [1], {"b": 1}, EVIL[0], EVIL[5]]
MISSING = object()


def _matrix(index, name):
    docs = [Document(f"v{i}", "", {} if v is MISSING else {"x": v}) for i, v in enumerate([*VALUES, MISSING])]
    vectors = unit(np.random.default_rng(0).normal(size=(len(docs), DIM)))
    index.upsert(name, docs, vectors)
    return docs


FILTERS = ([{"x": v} for v in VALUES if not isinstance(v, (list, dict))]
           + [{"x": {"$ne": v}} for v in (1, True, None, "1")]
           + [{"x": {op: n}} for op, n in itertools.product(("$gt", "$gte", "$lt", "$lte"), (0, 1, 1.0, 0.1, 2**62))]
           + [{"x": {"$in": [1, "a", None]}}, {"x": {"$nin": [1, "1", False]}}, {"x.b": 1},
              {"$or": [{"x": "a"}, {"x": {"$gt": 1}}]}, {"$and": [{"x": {"$gte": 1}}, {"x": {"$lt": 2}}]}])


def test_milvus_reads_each_pushed_expression_as_a_superset_and_search_is_exact(index, name):
    docs = _matrix(index, name)
    physical = index._describe(name)["collection_name"]
    for flt in FILTERS:
        expected = {d.id for d in docs if compile_filter(flt)(d.metadata)}
        expr = to_expression(flt)
        if expr is not None:
            pushed = {r["id"] for r in index._client.query(physical, filter=expr, output_fields=["id"])}
            assert expected <= pushed, (flt, expr)
        hits = index.search(name, unit(np.ones((1, DIM))), SearchParams(k=len(docs), filter=flt))[0]
        assert {h.id for h in hits} == expected, flt


@pytest.mark.parametrize("evil", EVIL)
def test_injection_attempts_match_only_their_own_string(index, name, evil):
    docs = [Document("plain", "", {"k": "other", "n": 1}), Document("evil", "", {"k": evil, "n": 2}),
            Document("none", "", {})]
    index.upsert(name, docs, unit(np.eye(3, DIM)))
    query = unit(np.ones((1, DIM)))
    assert [h.id for h in index.search(name, query, SearchParams(k=5, filter={"k": evil}))[0]] == ["evil"]
    assert sorted(h.id for h in index.search(name, query, SearchParams(k=5, filter={"k": {"$ne": evil}}))[0]) \
        == ["none", "plain"]
    assert index.delete(name, filter={"k": evil}).count == 1
    assert sorted(r.id for r in index.get(name, ["plain", "evil", "none"])) == ["none", "plain"]


def test_a_filter_milvus_cannot_push_down_is_never_short(index, name, monkeypatch):
    # 300 documents nearest the query fail the filter ($ne is checked in Python only); 5 pass, far away
    rng = np.random.default_rng(3)
    near = unit(np.ones((300, DIM)) + 0.01 * rng.normal(size=(300, DIM)))
    far = unit(-np.ones((5, DIM)) + 0.01 * rng.normal(size=(5, DIM)))
    docs = [Document(f"n{i}", "", {"g": "near"}) for i in range(300)] + [Document(f"f{i}", "", {}) for i in range(5)]
    index.upsert(name, docs, np.vstack([near, far]))
    query = unit(np.ones((2, DIM)))
    params = SearchParams(k=3, filter={"g": {"$ne": "near"}}, with_vector=True)
    expected = sorted((-(far @ query[0])).argsort()[:3].tolist())
    for hits in index.search(name, query, params):  # widening the candidate pool
        assert len(hits) == 3 and sorted(int(h.id[1:]) for h in hits) == expected
    monkeypatch.setattr(mv, "MAX_TOPK", 50)  # Milvus's limit reached first: the exact scan answers
    for hits in index.search(name, query, params):
        assert len(hits) == 3 and sorted(int(h.id[1:]) for h in hits) == expected
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert hits[0].vector is not None and hits[0].text == "" and hits[0].metadata == {}


def test_ivf_pq_falls_back_to_sq8_on_lite_and_keeps_its_spec(index):
    name = "pq" + uuid.uuid4().hex[:8]
    index.create_collection(CollectionSpec(name, 8, "IVF4,PQ4"))
    try:
        physical = index._describe(name)["collection_name"]
        described = index._client.describe_index(physical, "vector")
        assert (described["index_type"], described["params"]) == ("IVF_SQ8", {"nlist": 4})
        assert index.info(name).index_type == "IVF4,PQ4"
        with pytest.raises(InvalidRequest):
            index.create_collection(CollectionSpec("pqbad", 8, "IVF4,PQ3"))
    finally:
        index.drop_collection(name)


def test_index_build_parameters_reach_milvus(index):
    name = "hnsw" + uuid.uuid4().hex[:8]
    index.create_collection(CollectionSpec(name, DIM, "HNSW8"))
    try:
        described = index._client.describe_index(index._describe(name)["collection_name"], "vector")
        assert (described["index_type"], described["params"]) == ("HNSW", {"M": 8, "efConstruction": 40})
    finally:
        index.drop_collection(name)


def test_text_beyond_a_milvus_varchar_is_refused(index, name):
    with pytest.raises(InvalidRequest, match="65535"):
        index.upsert(name, [Document("a", "é" * 40_000)], unit(np.ones((1, DIM))))
    assert index.info(name).count == 0


def test_persistence_across_reopening_the_lite_file(tmp_path):
    path = str(tmp_path / "p.db")
    first = MilvusIndex(path)
    first.create_collection(CollectionSpec("keep", DIM, "HNSW16", ModelStamp("m", "ab" * 32)))
    docs = [Document(f"d{i}", f"text {i}", {"i": i, "tag": 'q"uote'}) for i in range(20)]
    vectors = unit(np.random.default_rng(1).normal(size=(20, DIM)))
    written = first.upsert("keep", docs, vectors)
    first.delete("keep", ids=["d0"])
    before = first.info("keep")
    first.close()

    again = MilvusIndex(path)
    try:
        info = again.info("keep")
        assert (info.count, info.dimension, info.index_type, info.model, info.sequence) == \
            (19, DIM, "HNSW16", ModelStamp("m", "ab" * 32), before.sequence)
        assert info.sequence > written.sequence
        record = again.get("keep", ["d5"], with_vector=True)[0]
        assert (record.text, record.metadata) == ("text 5", {"i": 5, "tag": 'q"uote'})
        assert np.allclose(record.vector, vectors[5], atol=1e-6)
        assert again.search("keep", vectors[7:8], SearchParams(k=1, filter={"tag": 'q"uote'}))[0][0].id == "d7"
        assert again.upsert("keep", docs[:1], vectors[:1]).sequence > info.sequence
        assert [c.name for c in again.list_collections()] == ["keep"]
    finally:
        again.close()


def test_two_clients_on_one_store_see_each_others_writes(index, name):
    other = MilvusIndex(index.uri)  # a second replica of the service
    try:
        a = index.upsert(name, [Document("a", "from one")], unit(np.ones((1, DIM))))
        assert [r.text for r in other.get(name, ["a"])] == ["from one"]
        b = other.upsert(name, [Document("b", "from two")], unit(np.ones((1, DIM))))
        assert b.sequence > a.sequence and b.total == 2
        assert index.info(name).sequence == b.sequence
    finally:
        other.close()
    assert index.info(name).count == 2  # closing one client leaves the shared Lite server running


def test_a_rebuild_refuses_writes_meanwhile_and_a_failed_one_changes_nothing(index, name):
    docs = [Document(f"d{i}", f"t{i}") for i in range(4)]
    index.upsert(name, docs, unit(np.eye(4, DIM)))
    before = {c.name for c in index.list_collections()}
    physical = set(index._client.list_collections())

    def batches():
        yield docs[:2], unit(np.eye(2, DIM))
        with pytest.raises(CollectionExists):  # writes during the rebuild would be lost by the swap
            index.upsert(name, [Document("late")], unit(np.ones((1, DIM))))
        raise RuntimeError("the model failed mid-rebuild")

    with pytest.raises(RuntimeError):
        index.replace_collection(CollectionSpec(name, DIM, "Flat", ModelStamp("new", "cd" * 32)), batches())
    assert index.info(name).count == 4 and index.info(name).model is None
    assert set(index._client.list_collections()) == physical  # the staging collection is gone
    assert {c.name for c in index.list_collections()} == before
    assert index.upsert(name, [Document("after")], unit(np.ones((1, DIM)))).total == 5  # writable again

    result = index.replace_collection(CollectionSpec(name, DIM, "HNSW16", ModelStamp("new", "cd" * 32)),
                                      [(docs[:3], unit(np.eye(3, DIM)))])
    assert (result.count, result.total) == (3, 3)
    assert index.info(name).index_type == "HNSW16"


def test_the_milvus_backend_does_not_import_torch():
    code = "import sys, service.index.milvus, pymilvus; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_lexical_indexes_and_their_search_modes_are_refused_by_name(index, name):
    with pytest.raises(InvalidRequest, match="lexical indexes .* not available on the milvus backend"):
        index.create_collection(CollectionSpec("t" + uuid.uuid4().hex[:12], DIM, lexical=True))
    index.upsert(name, [Document("a", "a red fox")], unit([[1, 0, 0, 0]]))
    for mode in ("lexical", "hybrid"):
        with pytest.raises(InvalidRequest, match=f"mode '{mode}' needs a lexical index"):
            index.search(name, unit([[1, 0, 0, 0]]), SearchParams(mode=mode, texts=["fox"]))
    assert index.info(name).lexical is False
    assert [h.id for h in index.search(name, unit([[1, 0, 0, 0]]), SearchParams())[0]] == ["a"]


def test_sparse_vectors_and_their_search_mode_are_refused_by_name(index, name):
    from service.index import ModelStamp
    from service.index.base import SparseRows

    with pytest.raises(InvalidRequest, match="sparse vectors .* not available on the milvus backend"):
        index.create_collection(CollectionSpec("t" + uuid.uuid4().hex[:12], DIM, sparse_model=ModelStamp("s", "0" * 64),
                                               sparse_dimension=100))
    rows = SparseRows(np.array([0, 1], np.int64), np.array([3], np.int32), np.ones(1, np.float32))
    with pytest.raises(InvalidRequest, match="keeps no sparse vectors"):
        index.upsert(name, [Document("a", "a red fox")], unit([[1, 0, 0, 0]]), rows)
    with pytest.raises(InvalidRequest, match="mode 'sparse' needs a lexical index or sparse vectors"):
        index.search(name, None, SearchParams(mode="sparse", sparse_queries=[([3], [1.0])]))
    assert index.info(name).sparse_model is None and index.get(name, ["a"]) == []
