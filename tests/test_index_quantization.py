"""Compact vectors (issue 41): collections whose searched structure holds int8 codes or sign bits, rescored
with the float vectors. Recall against exact float search on embedding-like vectors, exact rescored scores
in float order, the same answers after replaying the log or loading a snapshot (and after kill -9),
deletes, upserts and filters, the float vectors on disk, the 422s over HTTP, and Milvus Lite's mapping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from contextlib import closing
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.index import CollectionSpec, Document, InvalidRequest, LocalIndex, SearchParams
from service.index import vectors as vectors_module
from service.index.vectors import QUANT_TRAIN_ROWS, VectorSet

DIM = 128
N = 4000
K = 10
REPO = Path(__file__).resolve().parent.parent
BARS = {"int8": 0.99, "binary": 0.95}  # the recall@10 targets against exact float search


def unit(rows):
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


class Embeddings:
    """Unit vectors shaped like sentence embeddings, where sign bits are not a free lunch: every vector
    shares a mean direction (embeddings are anisotropic: a few dimensions keep their sign across the
    corpus), the variance decays over the dimensions (a spectrum, as a model's has), and vectors gather
    around topics with their own spread. Independent Gaussian noise would make any quantisation's
    recall look like a property of the noise rather than of the method."""

    def __init__(self, dim: int = DIM, topics: int = 60, seed: int = 0):
        rng = np.random.default_rng(seed)
        rotation = np.linalg.qr(rng.normal(size=(dim, dim)))[0].astype(np.float32)
        self.scales = (1.0 / np.sqrt(1.0 + np.arange(dim) / 6.0)).astype(np.float32) @ np.eye(dim, dtype=np.float32)
        self.rotation = rotation
        self.mean = 1.2 * unit(rng.normal(size=(1, dim)))[0]
        self.topics = rng.normal(size=(topics, dim)).astype(np.float32) * self.scales

    def sample(self, n: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        topic = self.topics[rng.integers(len(self.topics), size=n)]
        spread = rng.normal(size=(n, len(self.mean))).astype(np.float32) * self.scales * 0.8
        return unit((topic + spread) @ self.rotation + self.mean)


SOURCE = Embeddings()
DATA = SOURCE.sample(N, seed=1)
QUERIES = SOURCE.sample(50, seed=2)
META = [{"b": i % 10, "half": i % 2 == 0} for i in range(N)]


def exact(data, queries, k=K, rows=None):
    rows = np.arange(len(data)) if rows is None else np.asarray(rows)
    scores = queries @ data[rows].T
    return rows[np.argsort(-scores, axis=1, kind="stable")[:, :k]]


def recall(found_ids, truth_rows):
    return float(np.mean([len(set(f) & {f"d{j}" for j in t}) / len(t) for f, t in zip(found_ids, truth_rows)]))


def ids(results):
    return [[h.id for h in row] for row in results]


def filled(quantization, index_type="Flat", path=None, **options):
    index = LocalIndex(path, background=False, **options)
    index.create_collection(CollectionSpec("c", DIM, index_type, quantization=quantization))
    for i in range(0, N, 1000):
        index.upsert("c", [Document(f"d{j}", "", META[j]) for j in range(i, i + 1000)], DATA[i: i + 1000])
    built(index)
    return index


def built(index, name="c"):
    index._collections[name].vectors.build_now()


PARAMS = SearchParams(k=K, with_text=False, with_metadata=False)


# recall and rescoring -------------------------------------------------------------------------------

@pytest.mark.parametrize("index_type", ["Flat", "HNSW16"])
@pytest.mark.parametrize("quantization", ["int8", "binary"])
def test_recall_against_exact_float_clears_the_bar_and_rescoring_is_what_gets_it_there(quantization, index_type):
    index = filled(quantization, index_type)
    try:
        info = index.info("c")
        assert info.quantization == quantization and info.ann_ready
        truth = exact(DATA, QUERIES)
        found = ids(index.search("c", QUERIES, PARAMS))
        assert recall(found, truth) >= BARS[quantization]
        # one candidate per hit: the compact structure's own ranking, which binary alone gets badly wrong
        alone = recall(ids(index.search("c", QUERIES, SearchParams(k=K, oversample=1))), truth)
        if quantization == "binary":
            assert alone < 0.8 < BARS["binary"]
        assert alone <= recall(found, truth)
    finally:
        index.close()


@pytest.mark.parametrize("quantization", ["int8", "binary"])
def test_returned_scores_are_exact_cosines_in_float_order(quantization):
    index = filled(quantization, "HNSW16")
    try:
        results = index.search("c", QUERIES, SearchParams(k=K, with_vector=True))
        for q, row in zip(QUERIES, results):
            scores = [h.score for h in row]
            floats = [float(DATA[int(h.id[1:])] @ q) for h in row]
            assert np.allclose(scores, floats, atol=1e-5)  # the float vector's score, not the code's
            assert scores == sorted(scores, reverse=True)  # ranked as float search ranks them
            assert all(np.allclose(h.vector, DATA[int(h.id[1:])]) for h in row)  # float vectors come back
    finally:
        index.close()


@pytest.mark.parametrize("quantization,code_bytes", [("int8", DIM), ("binary", DIM // 8)])
@pytest.mark.parametrize("float_vectors", ["memory", "disk"])
def test_the_structure_holds_compact_codes_and_the_floats_live_where_asked(tmp_path, quantization, code_bytes,
                                                                           float_vectors):
    index = filled(quantization, "Flat", path=tmp_path, float_vectors=float_vectors)
    try:
        memory = index._collections["c"].vectors.memory()
        assert memory["structure_vectors"] == N * code_bytes  # 4x (int8) or 32x (binary) under N * DIM * 4
        files = list((tmp_path / "floats").glob("*.f32")) if float_vectors == "disk" else []
        if float_vectors == "disk":
            assert memory["slots"] == 0 and memory["slots_on_disk"] >= N * DIM * 4
            assert len(files) == 1 and files[0].stat().st_size == memory["slots_on_disk"]
        else:
            assert memory["slots"] >= N * DIM * 4 and memory["slots_on_disk"] == 0
            assert not (tmp_path / "floats").exists()
        found = ids(index.search("c", QUERIES, PARAMS))
    finally:
        index.close()
    with closing(LocalIndex(tmp_path, background=False)) as reopened:  # floats in memory this time
        built(reopened)
        assert ids(reopened.search("c", QUERIES, PARAMS)) == found


# int8 training ----------------------------------------------------------------------------------------

def test_int8_searches_exactly_until_the_write_that_reaches_the_training_size_trains_it():
    vs = VectorSet(DIM, "Flat", background=False, quantization="int8")
    try:
        vs.append(DATA[: QUANT_TRAIN_ROWS - 1])
        vs.build_now()
        assert vs.ranges is None and not vs.ann_ready  # nothing to build a structure with yet
        scores, slots = vs.search(QUERIES, K)
        assert (slots == exact(DATA[: QUANT_TRAIN_ROWS - 1], QUERIES)).all()  # exact meanwhile
        vs.kill(np.array([0]))
        vs.append(DATA[QUANT_TRAIN_ROWS - 1: QUANT_TRAIN_ROWS])
        assert vs.ranges is None  # 999 live: a delete puts training off
        vs.append(DATA[QUANT_TRAIN_ROWS: QUANT_TRAIN_ROWS + 1])
        assert vs.ranges is not None and vs.ranges.shape == (2 * DIM,)
        vs.build_now()
        assert vs.ann_ready and vs.memory()["structure_vectors"] == QUANT_TRAIN_ROWS * DIM
        # the ranges come from the live vectors then, and cover them
        live = np.delete(DATA[: QUANT_TRAIN_ROWS + 1], 0, axis=0)
        low, width = vs.ranges[:DIM], vs.ranges[DIM:]
        assert (low <= live.min(axis=0)).all() and (low + width >= live.max(axis=0)).all()
    finally:
        vs.close()


# durability: replay, snapshots, kill -9 ------------------------------------------------------------

def _history(index, snapshot_at):
    """Writes that train int8 part way, with deletes and replacements, and snapshots where asked."""
    rng = np.random.default_rng(7)
    replaced = unit(DATA[:300] + 0.5 * rng.normal(size=(300, DIM)).astype(np.float32))
    steps = [
        lambda: index.upsert("c", [Document(f"d{j}", "", META[j]) for j in range(700)], DATA[:700]),
        lambda: index.delete("c", ids=[f"d{j}" for j in range(0, 700, 7)]),
        lambda: index.upsert("c", [Document(f"d{j}", "", META[j]) for j in range(700, 2500)], DATA[700:2500]),
        lambda: index.upsert("c", [Document(f"d{j}", "", {"b": 99}) for j in range(300)], replaced),
        lambda: index.delete("c", filter={"b": 3}),
        lambda: index.upsert("c", [Document(f"d{j}", "", META[j]) for j in range(2500, N)], DATA[2500:]),
    ]
    for i, step in enumerate(steps):
        step()
        if i in snapshot_at:
            index.snapshot()


def _answers(index):
    built(index)
    filtered = SearchParams(k=K, filter={"half": True}, with_text=False, with_metadata=False)
    return [[(h.id, h.score) for h in row] for params in (PARAMS, filtered)
            for row in index.search("c", QUERIES, params)]


@pytest.mark.parametrize("quantization", ["int8", "binary"])
@pytest.mark.parametrize("snapshot_at", [(), (1,), (3,), (1, 4)], ids=["log-only", "before-training",
                                                                      "after-training", "both"])
def test_replaying_the_log_or_loading_a_snapshot_answers_identically(tmp_path, quantization, snapshot_at):
    index = LocalIndex(tmp_path, background=False)
    index.create_collection(CollectionSpec("c", DIM, "Flat", quantization=quantization))
    _history(index, snapshot_at)
    before = _answers(index)
    ranges = index._collections["c"].vectors.ranges
    count = index.info("c").count
    index.close()
    with closing(LocalIndex(tmp_path, background=False)) as again:
        assert again.info("c").quantization == quantization and again.info("c").count == count
        assert _answers(again) == before  # the same ids with the same scores, filtered or not
        restored = again._collections["c"].vectors.ranges
        assert (ranges is None) == (quantization == "binary")
        if ranges is not None:
            assert restored is not None and np.array_equal(restored, ranges)


KILLED = r"""
import sys
import uuid
import numpy as np
from service.index import CollectionSpec, Document, LocalIndex
index = LocalIndex(sys.argv[1], snapshot_every_ops=int(sys.argv[3]))
index.create_collection(CollectionSpec("c", 16, "HNSW8", quantization=sys.argv[2]), exist_ok=True)
rng = np.random.default_rng(0)
i = 0
while True:
    vectors = rng.normal(size=(50, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index.upsert("c", [Document(f"d{i + j}") for j in range(50)], vectors)
    print(i + 49, flush=True)  # acknowledged: durable
    i += 50
"""


@pytest.mark.parametrize("quantization", ["int8", "binary"])
def test_kill_9_while_writing_loses_no_acknowledged_document(tmp_path, quantization):
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path), quantization, "17"],
                             stdout=subprocess.PIPE, text=True, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    acknowledged = -1
    assert child.stdout is not None
    for line in child.stdout:
        acknowledged = int(line)
        if acknowledged >= 2500:  # past int8's training and several snapshots
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with closing(LocalIndex(tmp_path, background=False)) as index:
        assert index.info("c").count >= acknowledged + 1 and index.info("c").quantization == quantization
        built(index)
        wanted = [f"d{i}" for i in range(acknowledged + 1)]
        assert len(index.get("c", wanted, with_vector=True)) == len(wanted)
        for record in index.get("c", wanted[::97], with_vector=True):  # each one is found by its own vector
            hits = index.search("c", np.asarray([record.vector], np.float32), SearchParams(k=1))
            assert hits[0][0].id == record.id and hits[0][0].score == pytest.approx(1.0, abs=1e-5)


# deletes, upserts, filters ---------------------------------------------------------------------------

@pytest.mark.parametrize("index_type", ["Flat", "HNSW16"])
@pytest.mark.parametrize("quantization", ["int8", "binary"])
def test_deleted_documents_never_come_back_and_replaced_ones_are_found_at_their_new_place(quantization,
                                                                                          index_type):
    index = filled(quantization, index_type)
    try:
        gone = {f"d{j}" for j in exact(DATA, QUERIES[:5], 3).ravel()}
        index.delete("c", ids=sorted(gone))
        moved = unit(np.random.default_rng(3).normal(size=(20, DIM)))
        index.upsert("c", [Document(f"d{j}", "", {"b": 42}) for j in range(20)], moved)
        built(index)
        assert not gone & {h.id for row in index.search("c", QUERIES[:5], PARAMS) for h in row}
        hits = index.search("c", moved, SearchParams(k=1, with_text=False))
        assert [row[0].id for row in hits] == [f"d{j}" for j in range(20)]
        assert all(row[0].metadata == {"b": 42} and row[0].score == pytest.approx(1.0, abs=1e-5) for row in hits)
        assert index.info("c").count == N - len(gone)
    finally:
        index.close()


@pytest.mark.parametrize("index_type", ["Flat", "HNSW16"])
@pytest.mark.parametrize("exact_below", [vectors_module.EXACT_BELOW, 100], ids=["few-allowed", "selector"])
@pytest.mark.parametrize("quantization", ["int8", "binary"])
def test_filters_apply_before_ranking_and_keep_the_recall(quantization, exact_below, index_type, monkeypatch):
    monkeypatch.setattr(vectors_module, "EXACT_BELOW", exact_below)  # 100: a filter's slots go to the structure
    index = filled(quantization, index_type)
    # An HNSW walk with a selector passing 10% of the nodes misses some neighbours with float vectors too
    # (float HNSW16 finds 0.96 of them here): the bar there is below the issue's.
    bar = BARS[quantization] if index_type == "Flat" or exact_below > N else 0.9
    try:
        for spec, rows in (({"b": 3}, [j for j in range(N) if j % 10 == 3]),
                           ({"half": True}, list(range(0, N, 2)))):
            results = index.search("c", QUERIES, SearchParams(k=K, filter=spec, with_text=False))
            assert all(len(row) == K for row in results)  # never short
            assert all(all(h.metadata[key] == value for key, value in spec.items()) for row in results for h in row)
            assert recall(ids(results), exact(DATA, QUERIES, rows=rows)) >= bar
    finally:
        index.close()


def test_an_unknown_or_unstorable_quantization_or_oversample_is_refused_naming_the_options():
    index = LocalIndex(None, background=False)
    try:
        with pytest.raises(InvalidRequest, match="use none, int8 or binary"):
            index.create_collection(CollectionSpec("c", DIM, "Flat", quantization="int4"))
        with pytest.raises(InvalidRequest, match="applies to Flat and HNSW<M>"):
            index.create_collection(CollectionSpec("c", DIM, "IVF16,SQ8", quantization="binary"))
        assert not index.list_collections()
        index.create_collection(CollectionSpec("c", DIM, "Flat", quantization="binary"))
        index.upsert("c", [Document("a")], DATA[:1])
        with pytest.raises(InvalidRequest, match="oversample must be between 1 and 100"):
            index.search("c", QUERIES[:1], SearchParams(k=1, oversample=0))
    finally:
        index.close()


# over HTTP -------------------------------------------------------------------------------------------

def test_the_collection_routes_take_report_and_refuse_quantization(tmp_path):
    from tests.test_index_api import make_server

    with make_server(tmp_path) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        r = c.post("/collections", json={"name": "small", "quantization": "binary"})
        assert r.status_code == 201 and r.json()["quantization"] == "binary"
        assert c.get("/collections/small").json()["quantization"] == "binary"
        assert c.get("/collections/default").json()["quantization"] == "none"
        listed = {x["name"]: x["quantization"] for x in c.get("/collections").json()["collections"]}
        assert listed == {"default": "none", "small": "binary"}

        unknown = c.post("/collections", json={"name": "x", "quantization": "float16"})
        assert unknown.status_code == 422
        assert all(option in unknown.text for option in ("'none'", "'int8'", "'binary'"))
        ivf = c.post("/collections", json={"name": "x", "index_type": "IVF8,SQ8", "quantization": "int8"})
        assert ivf.status_code == 422 and "Flat and HNSW<M>" in ivf.json()["error"]
        assert c.get("/collections/x").status_code == 404

        docs = [{"id": f"v{i}", "vector": v.tolist()} for i, v in enumerate(DATA[:1200, :8])]
        c.post("/collections", json={"name": "vec", "vectors_only": True, "dimension": 8, "quantization": "int8"})
        for i in range(0, len(docs), 200):  # past int8's training size
            assert c.post("/collections/vec/documents", json={"documents": docs[i: i + 200]}).status_code == 200
        body = {"vector": DATA[5, :8].tolist(), "k": 3, "oversample": 4}
        hits = c.post("/collections/vec/search", json=body).json()["results"][0]
        assert hits[0]["id"] == "v5" and hits[0]["score"] == pytest.approx(1.0, abs=1e-5)
        for bad in (0, 101):
            r = c.post("/collections/vec/search", json={**body, "oversample": bad})
            assert r.status_code == 422 and "oversample" in r.text


# Milvus Lite ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def milvus(tmp_path_factory):
    pytest.importorskip("pymilvus")
    pytest.importorskip("milvus_lite")
    from service.index.milvus import MilvusIndex

    path = tmp_path_factory.mktemp("milvus") / "quantized.db"
    store = MilvusIndex(str(path))
    store.path = path
    yield store
    store.close()


@pytest.mark.parametrize("index_type,milvus_type,build", [("Flat", "IVF_SQ8", {"nlist": 1}),
                                                          ("HNSW16", "HNSW_SQ", {"M": 16, "sq_type": "SQ8"})])
def test_milvus_maps_int8_to_its_own_int8_index_and_rescores_with_the_float_vectors(milvus, index_type,
                                                                                     milvus_type, build):
    from service.index.milvus import MilvusIndex

    name = "q" + uuid.uuid4().hex[:12]
    milvus.create_collection(CollectionSpec(name, DIM, index_type, quantization="int8"))
    try:
        n = 2000
        for i in range(0, n, 1000):
            milvus.upsert(name, [Document(f"d{j}", "", META[j]) for j in range(i, i + 1000)], DATA[i: i + 1000])
        milvus.flush(name)
        physical = milvus._describe(name)["collection_name"]
        index = milvus._client.describe_index(physical, "vector")
        assert index["index_type"] == milvus_type and all(index["params"][k] == v for k, v in build.items())
        assert milvus.info(name).quantization == "int8"
        results = milvus.search(name, QUERIES, PARAMS)
        assert recall(ids(results), exact(DATA[:n], QUERIES)) >= BARS["int8"]
        for q, row in zip(QUERIES, results):
            assert np.allclose([h.score for h in row], [float(DATA[int(h.id[1:])] @ q) for h in row], atol=1e-5)
        filtered = milvus.search(name, QUERIES, SearchParams(k=K, filter={"b": 3}))
        assert all(len(row) == K and all(h.metadata["b"] == 3 for h in row) for row in filtered)
        with pytest.raises(InvalidRequest, match="oversample"):
            milvus.search(name, QUERIES[:1], SearchParams(k=1, oversample=101))
        replica = MilvusIndex(str(milvus.path))  # another process reads the spec from Milvus
        try:
            assert replica.info(name).quantization == "int8"
        finally:
            replica.close()
    finally:
        milvus.drop_collection(name)


def test_milvus_refuses_binary_and_quantized_ivf_by_name(milvus):
    with pytest.raises(InvalidRequest, match="'binary' is not available on the milvus backend.*'int8'.*'none'"):
        milvus.create_collection(CollectionSpec("binary", DIM, "Flat", quantization="binary"))
    with pytest.raises(InvalidRequest, match="use none, int8 or binary"):
        milvus.create_collection(CollectionSpec("odd", DIM, "Flat", quantization="int4"))
    with pytest.raises(InvalidRequest, match="applies to Flat and HNSW<M>"):
        milvus.create_collection(CollectionSpec("ivf", DIM, "IVF8,SQ8", quantization="int8"))
    assert not [c.name for c in milvus.list_collections() if c.name in ("binary", "odd", "ivf")]


def test_the_settings_reach_the_index(tmp_path):
    from service.index import open_configured
    from service.settings import Settings

    index = open_configured(Settings(index_path=tmp_path, index_oversample=3, index_float_vectors="disk"))
    try:
        index.create_collection(CollectionSpec("c", DIM, "Flat", quantization="int8"))
        assert index._collections["c"].vectors.oversample == 3
        assert len(list((tmp_path / "floats").glob("*.f32"))) == 1
    finally:
        index.close()
