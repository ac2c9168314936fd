"""VectorSet with HNSW keeps one copy of each vector: the structure's storage holds what it covers, and
the slot array only what it has not reached yet. Reads of covered slots come back from the structure."""

from __future__ import annotations

import threading

import faiss
import numpy as np
import pytest

from service.index import CollectionSpec, Document, LocalIndex, SearchParams
from service.index import vectors as vectors_module
from service.index.vectors import DEFAULT_EF_SEARCH, VectorSet
from tests.conftest import wait_until

DIM = 32


def unit(rows):
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def data(n, seed=0):
    return unit(np.random.default_rng(seed).normal(size=(n, DIM)))


def fill(vs, x, batch=500):
    for i in range(0, len(x), batch):
        vs.append(x[i: i + batch])


def test_hnsw_holds_about_one_copy_of_each_vector():
    n = 6000
    vs = VectorSet(DIM, "HNSW16", background=False)
    fill(vs, data(n))
    vs.build_now()
    memory = vs.memory()
    row = DIM * 4
    assert memory["structure_vectors"] == n * row  # the structure's own full copy
    assert memory["slots"] <= vectors_module.MIN_ROWS * row  # the slot array gave its covered rows up
    assert (memory["slots"] + memory["structure_vectors"]) / n <= 1.1 * row
    ivf = VectorSet(DIM, "IVF4,SQ8", background=False)  # IVF stores codes: the slot array keeps every vector
    fill(ivf, data(n))
    ivf.build_now()
    assert ivf.memory()["slots"] >= n * row and ivf.memory()["structure_vectors"] == n * DIM
    vs.close()
    ivf.close()


def test_reads_of_covered_slots_and_search_results_are_unchanged():
    n = 5000
    x = data(n)
    queries = data(20, seed=1)
    vs = VectorSet(DIM, "HNSW16", background=False)
    fill(vs, x)
    vs.build_now()
    assert vs._store[1] == n  # everything covered and given up by the slot array
    # The same FAISS structure built the same way answers the same, score for score.
    reference = faiss.IndexIDMap(faiss.IndexHNSWFlat(DIM, 16, faiss.METRIC_INNER_PRODUCT))
    reference.add_with_ids(x, np.arange(n, dtype=np.int64))
    params = faiss.SearchParametersHNSW(efSearch=DEFAULT_EF_SEARCH)
    want_scores, want_slots = reference.search(queries, 10, params=params)
    scores, slots = vs.search(queries, 10)
    assert np.array_equal(slots, want_slots) and np.allclose(scores, want_scores)
    for slot in (0, 1, 2500, n - 1):
        assert np.array_equal(vs.vector(slot), x[slot])
    rows = np.arange(0, n, 7)
    assert np.array_equal(vs.view()[0][rows], x[rows])  # what a snapshot writes
    allowed = np.arange(100, 400)  # few allowed: exact search over vectors gathered from the structure
    scores, slots = vs.search(queries, 10, allowed)
    exact = allowed[np.argsort(-(queries @ x[allowed].T), axis=1)[:, :10]]
    assert np.array_equal(slots, exact)

    dead = np.arange(0, n, 3)  # a third dies: the structure is rebuilt from the live slots
    vs.kill(dead)
    snapshot_view, live = vs.view()
    old_structure = vs._ann
    vs.build_now()
    assert vs._ann is not old_structure and vs._ann.ntotal == n - len(dead)
    assert vs.vector(0) is None and np.array_equal(vs.vector(1), x[1])
    live_rows = np.flatnonzero(live)
    assert np.array_equal(snapshot_view[live_rows], x[live_rows])  # a view taken before the rebuild still reads
    scores, slots = vs.search(queries, 10)
    assert not set(slots.ravel().tolist()) & set(dead.tolist())
    brute = live_rows[np.argsort(-(queries @ x[live_rows].T), axis=1)[:, :10]]
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(slots.tolist(), brute.tolist())])
    assert recall >= 0.9
    vs.close()


def test_reads_spanning_the_structure_and_the_slot_array():
    n = 3000
    x = data(n + 200)
    vs = VectorSet(DIM, "HNSW16", background=False)
    fill(vs, x[:n])
    vs.build_now()
    vs.append(x[n:])  # not covered yet: in the slot array, above its base
    assert vs._store[1] == n
    rows = np.arange(0, n + 200, 5)
    assert np.array_equal(vs.view()[0][rows], x[rows])
    allowed = np.arange(n - 300, n + 200)
    queries = data(5, seed=2)
    _, slots = vs.search(queries, 10, allowed)
    assert np.array_equal(slots, allowed[np.argsort(-(queries @ x[allowed].T), axis=1)[:, :10]])
    vs.kill(np.arange(n - 300, n - 200))
    vectors, found = vs.gather(allowed, vs._store, vs._ann)
    assert found.all() and np.array_equal(vectors, x[allowed])  # dead but not rebuilt: still readable
    vs.close()


def test_concurrent_writes_builds_and_reads_see_the_vectors_written(monkeypatch):
    monkeypatch.setattr(vectors_module, "BUILD_CHUNK", 256)
    monkeypatch.setattr(vectors_module, "TRIM_MIN", 256)
    n = 6000
    x = data(n)
    vs = VectorSet(DIM, "HNSW8", background=True)
    errors: list[str] = []
    done = threading.Event()

    def reader(seed):
        rng = np.random.default_rng(seed)
        while not done.is_set():
            top = vs.n
            if top == 0:
                continue
            slots = rng.integers(top, size=5)
            for slot in slots.tolist():
                v = vs.vector(slot)
                if v is None or not np.array_equal(v, x[slot]):
                    errors.append(f"slot {slot}")
            allowed = np.sort(rng.choice(top, size=min(top, 50), replace=False))
            _, found = vs.search(x[allowed[:1]], 1, allowed)
            if found[0, 0] != allowed[0]:
                errors.append(f"search for {allowed[0]} found {found[0, 0]}")

    readers = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in readers:
        t.start()
    try:
        fill(vs, x, batch=50)
        wait_until(lambda: vs._covered >= n, 60, what=f"the background pass to cover all {n} rows")
    finally:
        done.set()
        for t in readers:
            t.join()
        vs.close()
    assert not errors, errors[:5]
    assert vs._store[1] > 0  # the slot array did give rows up while readers read


def test_a_snapshot_of_an_hnsw_collection_reads_its_vectors_back(tmp_path, monkeypatch):
    monkeypatch.setattr(vectors_module, "TRIM_MIN", 1)
    x = data(600)
    index = LocalIndex(tmp_path / "index", background=False)
    index.create_collection(CollectionSpec("h", DIM, "HNSW16"))
    index.upsert("h", [Document(f"d{i}", "", {"i": i}) for i in range(600)], x)
    index._collections["h"].vectors.build_now()
    index.delete("h", ids=[f"d{i}" for i in range(0, 600, 2)])
    index.snapshot()
    index.close()
    reopened = LocalIndex(tmp_path / "index", background=False)
    records = reopened.get("h", [f"d{i}" for i in range(600)], with_vector=True)
    assert [r.id for r in records] == [f"d{i}" for i in range(1, 600, 2)]
    assert np.allclose([r.vector for r in records], x[1::2])
    hits = reopened.search("h", x[7:8], SearchParams(k=1, with_vector=True))[0]
    assert hits[0].id == "d7" and np.allclose(hits[0].vector, x[7])
    reopened.close()


@pytest.mark.parametrize("index_type", ["Flat", "IVF4,SQ8"])
def test_other_types_keep_every_vector_in_the_slot_array(index_type):
    vs = VectorSet(DIM, index_type, background=False)
    fill(vs, data(3000))
    vs.build_now()
    assert vs._store[1] == 0 and np.array_equal(vs.vector(5), data(3000)[5])
    vs.close()


def test_hnsw_builds_wider_than_its_level0_links():
    """FAISS's default efConstruction (40) is narrower than HNSW32's 64 level-0 links: the graph it
    builds loses recall at scale (RESULTS.md), so the build width follows M."""
    for spec, want in (("HNSW16", 40), ("HNSW32", 80), ("HNSW64", 160)):
        vs = VectorSet(DIM, spec, background=False)
        fill(vs, data(300))
        vs.build_now()
        assert faiss.downcast_index(vs._ann.index).hnsw.efConstruction == want
        vs.close()
