"""Sparse (SPLADE) vectors beside a collection's dense ones (issue 41): the store alone against numpy's dot
products (appends across blocks and merges, deletes, filters), and in LocalIndex (a vector per chunk, mode
sparse, hybrid fusion, replaces and deletes, refusals, the log's replay and snapshots)."""

from __future__ import annotations

import numpy as np
import pytest

from service.index import CollectionSpec, Document, InvalidRequest, LocalIndex, ModelStamp, SearchParams
from service.index import sparse as sparse_module
from service.index.base import SparseRows
from service.index.sparse import SparseStore
from tests.test_index_remote import served  # noqa: F401 - a fixture, used by name

VOCAB = 50
DIM = 8
STAMP = ModelStamp("splade", "0" * 64)


def random_rows(rng: np.random.Generator, n: int, active: int = 6) -> np.ndarray:
    """n dense rows of VOCAB with up to `active` positive entries each (some rows empty)."""
    dense = np.zeros((n, VOCAB), np.float32)
    for row in dense:
        cols = rng.choice(VOCAB, size=rng.integers(0, active + 1), replace=False)
        row[cols] = rng.random(len(cols)).astype(np.float32) + 0.01
    return dense


def as_rows(dense: np.ndarray) -> SparseRows:
    rows, cols = np.nonzero(dense)
    indptr = np.searchsorted(rows, np.arange(len(dense) + 1)).astype(np.int64)
    return SparseRows(indptr, cols.astype(np.int32), dense[rows, cols].astype(np.float32))


def query_of(dense_row: np.ndarray) -> tuple[list[int], list[float]]:
    cols = np.flatnonzero(dense_row)
    return cols.tolist(), dense_row[cols].tolist()


def expected(matrix: np.ndarray, live: np.ndarray, query: np.ndarray, k: int,
             allowed: np.ndarray | None = None) -> tuple[list[int], np.ndarray]:
    scores = matrix @ query
    ok = (scores > 0) & live[: len(matrix)]
    if allowed is not None:
        mask = np.zeros(len(matrix), bool)
        mask[allowed] = True
        ok &= mask
    slots = np.flatnonzero(ok)
    order = np.lexsort((slots, -scores[slots]))[:k]
    return slots[order].tolist(), scores[slots[order]]


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few rows, so a handful of writes crosses the tail, block building and merging."""
    monkeypatch.setattr(sparse_module, "TAIL_ROWS", 7)
    monkeypatch.setattr(sparse_module, "MAX_BLOCK_ROWS", 40)


# --- the store alone ---------------------------------------------------------------------------------------

def test_scores_are_dot_products_over_blocks_merges_and_the_tail(small_blocks):
    rng = np.random.default_rng(0)
    store = SparseStore(VOCAB)
    matrix = np.zeros((0, VOCAB), np.float32)
    live = np.ones(400, bool)
    for size in [1, 3, 5, 1, 9, 2, 20, 1, 1, 4, 33, 2, 8, 1]:  # single rows and batches, across every boundary
        rows = random_rows(rng, size)
        store.append(len(matrix), as_rows(rows), live)
        matrix = np.vstack([matrix, rows])
        query = random_rows(rng, 1, active=10)[0]
        assert store.count == len(matrix)
        assert np.allclose(store.scores(*map(np.asarray, query_of(query))), matrix @ query, atol=1e-6)
        [(scores, slots)] = store.search([query_of(query)], 5, live, None)
        want_slots, want_scores = expected(matrix, live, query, 5)
        assert slots.tolist() == want_slots and np.allclose(scores, want_scores, atol=1e-6)
    assert len(store.view().blocks) < len(matrix) // sparse_module.TAIL_ROWS  # merged


def test_dead_slots_and_filters_are_left_out_and_merges_drop_dead_entries(small_blocks):
    rng = np.random.default_rng(1)
    store = SparseStore(VOCAB)
    live = np.ones(200, bool)
    matrix = random_rows(rng, 60)
    for first in range(0, 30, 3):
        store.append(first, as_rows(matrix[first: first + 3]), live)
    live[[0, 4, 5, 17, 29]] = False  # deleted after they were written
    for first in range(30, 60, 5):  # more writes: blocks merge, leaving the dead rows' entries out
        store.append(first, as_rows(matrix[first: first + 5]), live)
    state = store.view()
    merged = sum(b.matrix.nnz for b in state.blocks) + sum(p.nnz for p in state.tail)
    dead = np.count_nonzero(matrix[~live[:60]])
    assert dead and np.count_nonzero(matrix) - dead <= merged < np.count_nonzero(matrix)  # dead entries are gone
    allowed = np.arange(0, 60, 2)
    for query in random_rows(rng, 10, active=20):
        for allow in (None, allowed):
            [(scores, slots)] = store.search([query_of(query)], 8, live, allow)
            want, want_scores = expected(matrix, live, query, 8, allow)
            assert slots.tolist() == want and np.allclose(scores, want_scores, atol=1e-6)
    # a snapshot's rows: the live ones, as written
    rows = np.flatnonzero(live[:60])
    assert np.allclose(store.rows(state, rows).toarray(), matrix[rows])


def test_a_block_no_merge_takes_is_made_again_once_a_quarter_of_it_died(monkeypatch):
    monkeypatch.setattr(sparse_module, "TAIL_ROWS", 10)
    monkeypatch.setattr(sparse_module, "MAX_BLOCK_ROWS", 20)  # blocks of 20 rows never merge again
    rng = np.random.default_rng(3)
    store = SparseStore(VOCAB)
    live = np.ones(100, bool)
    matrix = random_rows(rng, 100, active=8)
    for first in range(0, 40, 10):
        store.append(first, as_rows(matrix[first: first + 10]), live)
    assert [(b.first, b.matrix.shape[0]) for b in store.view().blocks] == [(0, 20), (20, 20)]
    live[[1, 2, 3, 4, 5, 21, 22]] = False  # a quarter of the first block, less of the second
    store.append(40, as_rows(matrix[40:50]), live)
    first, second, _ = store.view().blocks
    assert first.matrix.nnz == np.count_nonzero(matrix[:20][live[:20]]) and first.dropped == 5
    assert second.matrix.nnz == np.count_nonzero(matrix[20:40]) and second.dropped == 0  # under a quarter: kept
    for query in random_rows(rng, 5, active=20):
        [(scores, slots)] = store.search([query_of(query)], 10, live, None)
        want, want_scores = expected(matrix[:50], live, query, 10)
        assert slots.tolist() == want and np.allclose(scores, want_scores, atol=1e-6)


def test_ties_go_to_the_earlier_slot_and_a_query_sharing_no_dimension_finds_nothing():
    store = SparseStore(VOCAB)
    live = np.ones(10, bool)
    same = np.zeros((4, VOCAB), np.float32)
    same[:, 3] = 1.0
    store.append(0, as_rows(same), live)
    [(scores, slots)] = store.search([([3], [2.0])], 3, live, None)
    assert slots.tolist() == [0, 1, 2] and scores.tolist() == [2.0, 2.0, 2.0]
    assert store.search([([4, 9], [1.0, 1.0])], 3, live, None)[0][1].tolist() == []
    assert store.search([([], [])], 3, live, None)[0][1].tolist() == []
    assert store.search([([VOCAB + 5], [1.0])], 3, live, None)[0][1].tolist() == []  # outside: scores nothing


# --- in LocalIndex ---------------------------------------------------------------------------------------------

TEXTS = {"kinase": "the kinase QX9981", "fox": "a quick brown fox", "dog": "a lazy dog", "cat": "a cat"}
WORD = {"kinase": 1, "qx9981": 2, "quick": 3, "brown": 4, "fox": 5, "lazy": 6, "dog": 7, "cat": 8, "the": 9, "a": 10}


def bag(text: str, weight: float = 1.0) -> np.ndarray:
    """A stand-in sparse model: a dimension per known word."""
    row = np.zeros(VOCAB, np.float32)
    for w in text.lower().split():
        if w in WORD:
            row[WORD[w]] += weight
    return row


def vec(key: str) -> np.ndarray:
    v = np.random.default_rng(abs(hash(key)) % 2**32).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def put(index: LocalIndex, docs: list[Document], name: str = "c") -> None:
    chunks = [d.text[a:b] for d in docs for a, b in d.spans()]
    index.upsert(name, docs, np.stack([vec(t) for t in chunks]), as_rows(np.stack([bag(t) for t in chunks])))


def docs(*ids: str, **metadata) -> list[Document]:
    return [Document(i, TEXTS[i], {"id": i, **metadata}) for i in ids]


def sparse_search(index: LocalIndex, *queries: str, name: str = "c", k: int = 10, **params):
    hits = index.search(name, None, SearchParams(k=k, mode="sparse", sparse_queries=[query_of(bag(q))
                                                                                     for q in queries], **params))
    return [[(h.id, h.score) for h in row] for row in hits]


@pytest.fixture
def index():
    index = LocalIndex(background=False)
    index.create_collection(CollectionSpec("c", DIM, sparse_model=STAMP, sparse_dimension=VOCAB))
    yield index
    index.close()


def test_sparse_search_ranks_by_dot_product_and_follows_replaces_and_deletes(index):
    info = index.info("c")
    assert (info.sparse_model, info.sparse_dimension, info.lexical) == (STAMP, VOCAB, False)
    put(index, docs(*TEXTS))
    assert sparse_search(index, "QX9981") == [[("kinase", 1.0)]]
    assert [i for i, _ in sparse_search(index, "lazy fox fox")[0]] == ["fox", "dog"]
    assert sparse_search(index, "nothing known") == [[]]
    put(index, [Document("kinase", "a cat", {})])  # replaced: its old vector is gone
    assert sparse_search(index, "QX9981") == [[]]
    assert [i for i, _ in sparse_search(index, "cat")[0]] == ["cat", "kinase"]
    index.delete("c", ["cat"])
    assert sparse_search(index, "cat") == [[("kinase", 1.0)]]
    assert sparse_search(index, "a", filter={"id": "dog"}) == [[("dog", 1.0)]]


def test_a_chunked_document_has_a_sparse_vector_per_chunk_and_a_hit_is_its_best_chunk(index):
    text = "a quick brown fox ; the kinase QX9981 here"
    cut = text.index("the kinase")
    put(index, [Document("long", text, {}, [(0, cut), (cut, len(text))])] + docs("dog"))
    [[hit]] = index.search("c", None, SearchParams(k=5, mode="sparse", sparse_queries=[query_of(bag("QX9981"))]))
    assert (hit.id, hit.start, hit.end) == ("long", cut, len(text))
    [[hit]] = index.search("c", None, SearchParams(k=5, mode="sparse", sparse_queries=[query_of(bag("fox"))]))
    assert (hit.id, hit.start, hit.end) == ("long", 0, cut)


def test_hybrid_fuses_dense_and_sparse_and_lexical_when_the_collection_has_it():
    index = LocalIndex(background=False)
    index.create_collection(CollectionSpec("both", DIM, lexical=True, sparse_model=STAMP, sparse_dimension=VOCAB))
    put(index, docs(*TEXTS), "both")
    query = vec("a lazy dog")[None]  # the dense ranking puts dog first
    params = dict(mode="hybrid", texts=["QX9981"], sparse_queries=[query_of(bag("QX9981"))])
    hits = index.search("both", query, SearchParams(k=4, **params))[0]
    assert [h.id for h in hits][:2] == ["kinase", "dog"]  # lexical and sparse agree on kinase
    hits = index.search("both", query, SearchParams(k=4, sparse_weight=0, lexical_weight=0, **params))[0]
    assert hits[0].id == "dog"
    scores = [h.score for h in index.search("both", query, SearchParams(k=1, rrf_k=1, **params))[0]]
    assert scores == [pytest.approx(1 / 2 + 1 / 2 + 1 / (1 + [h.id for h in index.search(
        "both", query, SearchParams(k=4))[0]].index("kinase") + 1))]
    index.close()


def test_writes_and_searches_are_refused_when_sparse_vectors_do_not_fit(index):
    index.create_collection(CollectionSpec("plain", DIM))
    one = docs("fox")
    with pytest.raises(InvalidRequest, match="keeps sparse vectors: a write brings one per chunk"):
        index.upsert("c", one, vec("x")[None])
    with pytest.raises(InvalidRequest, match="keeps no sparse vectors"):
        index.upsert("plain", one, vec("x")[None], as_rows(bag("fox")[None]))
    bad = [SparseRows(np.array([0, 1], np.int64), np.array([VOCAB], np.int32), np.ones(1, np.float32)),
           SparseRows(np.array([0, 2], np.int64), np.array([3, 3], np.int32), np.ones(2, np.float32)),
           SparseRows(np.array([0, 1, 1], np.int64), np.array([3], np.int32), np.ones(1, np.float32)),
           SparseRows(np.array([0, 1], np.int64), np.array([3], np.int32), np.array([np.nan], np.float32))]
    for rows, says in zip(bad, ["outside the model's 50", "ascending and distinct", "of 1 rows", "finite"]):
        with pytest.raises(InvalidRequest, match=says):
            index.upsert("c", one, vec("x")[None], rows)
    assert index.info("c").count == 0  # nothing half-written
    q = vec("x")[None]
    with pytest.raises(InvalidRequest, match="dense, lexical, sparse, hybrid"):
        index.search("c", q, SearchParams(mode="semantic"))
    with pytest.raises(InvalidRequest, match="'plain' has no sparse vectors.*sparse_model"):
        index.search("plain", None, SearchParams(mode="sparse", sparse_queries=[([1], [1.0])]))
    with pytest.raises(InvalidRequest, match="'plain' has no lexical index and no sparse vectors"):
        index.search("plain", q, SearchParams(mode="hybrid", texts=["fox"]))
    with pytest.raises(InvalidRequest, match="sparse vector: give the query as text"):
        index.search("c", None, SearchParams(mode="sparse"))
    with pytest.raises(InvalidRequest, match="dense_weight and sparse_weight cannot all be 0"):
        index.search("c", q, SearchParams(mode="hybrid", sparse_queries=[([1], [1.0])], dense_weight=0,
                                          sparse_weight=0))
    # the lexical weight is not one of this collection's: only the two it fuses count
    put(index, docs("fox"))
    assert index.search("c", q, SearchParams(mode="hybrid", sparse_queries=[query_of(bag("fox"))],
                                             lexical_weight=0, dense_weight=0))[0][0].id == "fox"


def test_clear_and_a_rebuild_keep_the_sparse_vectors(index):
    put(index, docs("fox", "dog"))
    index.clear("c")
    assert index.info("c").sparse_model == STAMP and sparse_search(index, "fox") == [[]]
    spec = CollectionSpec("c", DIM, sparse_model=STAMP, sparse_dimension=VOCAB)
    rebuilt = docs("dog", "kinase")
    index.replace_collection(spec, iter([(rebuilt, np.stack([vec("d"), vec("k")]),
                                          as_rows(np.stack([bag(d.text) for d in rebuilt])))]))
    assert index.info("c").sparse_model == STAMP and [i for i, _ in sparse_search(index, "kinase dog")[0]] == [
        "dog", "kinase"]


def test_the_logs_replay_and_a_snapshot_rebuild_the_same_sparse_results(tmp_path, small_blocks):
    queries = ["QX9981 kinase", "lazy fox", "a", "cat the", "brown"]
    rng = np.random.default_rng(2)
    extra = {f"n{i}": " ".join(rng.choice(list(WORD), size=4)) for i in range(40)}  # past several blocks

    def history(index: LocalIndex, part: int) -> None:
        if part == 0:
            index.create_collection(CollectionSpec("c", DIM, sparse_model=STAMP, sparse_dimension=VOCAB))
            index.create_collection(CollectionSpec("plain", DIM))
            put(index, docs(*TEXTS, group="a"))
            for i, (key, text) in enumerate(extra.items()):
                put(index, [Document(key, text, {"group": "ab"[i % 2]})])
            index.delete("c", ["dog", "n3", "n4"])
            put(index, [Document("cat", "a cat and a dog", {"group": "b"})])
        else:
            text = "a quick fox. the kinase dog"
            put(index, [Document("long", text, {"group": "a"}, [(0, 12), (13, len(text))])])
            index.delete("c", filter={"id": "fox"})
            put(index, [Document("n7", "lazy lazy cat", {"group": "a"})])

    def results(index: LocalIndex):
        return sparse_search(index, *queries), sparse_search(index, *queries, filter={"group": "a"})

    live = LocalIndex(tmp_path / "index", background=False)
    history(live, 0)
    before_snapshot = results(live)
    live.close()
    replayed = LocalIndex(tmp_path / "index", background=False)  # the log alone
    assert results(replayed) == before_snapshot
    assert replayed.info("c").sparse_model == STAMP and replayed.info("plain").sparse_model is None
    replayed.snapshot()
    history(replayed, 1)
    after = results(replayed)
    replayed.close()
    reopened = LocalIndex(tmp_path / "index", background=False)  # the snapshot, then the log after it
    assert results(reopened) == after and reopened.info("c").sparse_dimension == VOCAB
    assert after != before_snapshot and all(after[0])
    reopened.snapshot()  # a snapshot of a snapshot's load
    reopened.close()
    again = LocalIndex(tmp_path / "index", background=False)
    assert results(again) == after
    again.close()


# --- through the index process's client ------------------------------------------------------------------------

def test_sparse_vectors_cross_to_the_index_process_in_writes_searches_and_replacements(served):  # noqa: F811
    index, client, _ = served
    client.create_collection(CollectionSpec("c", DIM, sparse_model=STAMP, sparse_dimension=VOCAB))
    put(client, docs(*TEXTS))
    assert client.info("c").sparse_model == STAMP
    assert sparse_search(client, "QX9981 lazy") == sparse_search(index, "QX9981 lazy") != [[]]
    assert [i for i, _ in sparse_search(client, "QX9981 lazy")[0]] == ["kinase", "dog"]
    with pytest.raises(InvalidRequest, match="outside the model's 50"):
        client.upsert("c", docs("fox"), vec("x")[None], SparseRows(np.array([0, 1]), np.array([99], np.int32),
                                                                   np.ones(1, np.float32)))
    rebuilt = docs("cat")
    client.replace_collection(CollectionSpec("c", DIM, sparse_model=STAMP, sparse_dimension=VOCAB),
                              iter([(rebuilt, vec("c")[None], as_rows(bag("a cat")[None]))]))
    assert sparse_search(client, "cat QX9981") == [[("cat", 1.0)]]


def test_re_embedding_makes_the_sparse_vectors_again_or_is_refused_without_the_sparse_model():
    from service.index.reembed import reembed

    index = LocalIndex(background=False)
    dense = ModelStamp("minilm", "1" * 64)
    index.create_collection(CollectionSpec("c", DIM, model=dense, sparse_model=STAMP, sparse_dimension=VOCAB))
    text = "a quick brown fox ; the kinase QX9981 here"
    cut = text.index("the kinase")
    put(index, [Document("long", text, {}, [(0, cut), (cut, len(text))])] + docs("dog", "cat"))
    before = sparse_search(index, "QX9981 fox", "lazy dog", "cat")

    def embed(texts: list[str]) -> np.ndarray:
        return np.stack([vec(t) for t in texts])

    with pytest.raises(InvalidRequest, match="keeps sparse vectors of splade"):
        reembed(index, "c", ModelStamp("minilm", "2" * 64), DIM, embed)  # offline: no sparse model to embed with
    assert index.info("c").model == dense
    seen: list[str] = []

    def embed_sparse(texts: list[str]) -> SparseRows:
        seen.extend(texts)
        return as_rows(np.stack([bag(t) for t in texts]))

    reembed(index, "c", ModelStamp("minilm", "2" * 64), DIM, embed, embed_sparse=embed_sparse)
    info = index.info("c")
    assert info.model == ModelStamp("minilm", "2" * 64) and (info.sparse_model, info.sparse_dimension) == (STAMP, VOCAB)
    assert sorted(seen) == sorted([text[:cut], text[cut:], TEXTS["dog"], TEXTS["cat"]])  # each chunk's text
    assert sparse_search(index, "QX9981 fox", "lazy dog", "cat") == before
    index.close()


# --- over HTTP, in process (fake backends) ------------------------------------------------------------------

def test_http_a_write_whose_sparse_embedding_fails_is_refused_whole(tmp_path):
    """The dense vectors come with the documents, so only the sparse model embeds: its engine fails on the word FAIL
    (the fake backend's failure), and nothing of the write is stored."""
    import httpx

    from service.engine.backends.fake import FakeBackend
    from service.engine.core import Engine
    from service.manifest import SPARSE
    from tests.test_index_api import make_server

    with make_server(tmp_path) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        live.registry.add_in_process("sparse", Engine(FakeBackend(name="sparse", dimension=64, kind=SPARSE)))
        reply = c.post("/collections", json={"name": "c", "model": "main", "sparse_model": "sparse"})
        assert reply.status_code == 201 and reply.json()["sparse_model"]["name"] == "sparse", reply.text
        assert reply.json()["sparse_dimension"] == 64
        reply = c.post("/collections", json={"name": "x", "sparse_model": "main"})
        assert reply.status_code == 422 and "the served sparse models are sparse" in reply.json()["error"]
        one = {"id": "a", "text": "a man plays the guitar", "vector": [1.0] * 8}
        assert c.post("/collections/c/documents", json={"documents": [one]}).status_code == 200
        failing = [{"id": "b", "text": "a woman plays the piano", "vector": [0.5] * 8},
                   {"id": "a", "text": "this one FAIL to embed", "vector": [0.2] * 8}]
        reply = c.post("/collections/c/documents", json={"documents": failing})
        assert reply.status_code == 424 and "FAIL" in reply.json()["error"], reply.text  # the model failed on it
        assert c.get("/collections/c").json()["count"] == 1  # neither b nor the new a
        assert c.get("/collections/c/documents/a").json()["text"] == one["text"]
        hits = c.post("/collections/c/search", json={"query": "guitar", "mode": "sparse"}).json()["results"][0]
        assert [h["id"] for h in hits] in ([], ["a"])  # the fake model's vectors: only a is stored
