"""Lexical (BM25) indexes beside a collection's vectors, and hybrid search by reciprocal rank fusion (issue 41):
the index alone, in LocalIndex (writes, deletes, replaces, filters, the log's replay and snapshots), and over
real HTTP (fake backend) for the options and their 422s."""

from __future__ import annotations

import math
import threading

import httpx
import numpy as np
import pytest

from service.index import CollectionSpec, Document, InvalidRequest, LocalIndex, SearchParams
from service.index.lexical import TERM_SET_MAX, LexicalIndex, fuse, tokenize

DIM = 8
TEXTS = {
    "kinase": "the zyx protein kinase QX9981 binds calcium",
    "protein": "protein folding and protein structure",
    "calcium": "calcium channels in heart muscle",
    "fox": "the quick brown fox jumps over the lazy dog",
    "dog": "a lazy dog sleeps all day",
}


def vec(doc_id: str) -> np.ndarray:
    v = np.random.default_rng(abs(hash(doc_id)) % 2**32).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def docs(*ids: str, texts=TEXTS, **metadata) -> list[Document]:
    return [Document(i, texts[i], {"id": i, **metadata}) for i in ids]


def put(index: LocalIndex, documents: list[Document], name: str = "c") -> None:
    index.upsert(name, documents, np.stack([vec(d.id + d.text) for d in documents]))


def lexical(index: LocalIndex, *queries: str, name: str = "c", k: int = 10, **params) -> list[list[tuple[str, float]]]:
    hits = index.search(name, None, SearchParams(k=k, mode="lexical", texts=list(queries), **params))
    return [[(h.id, h.score) for h in row] for row in hits]


# --- the index alone ----------------------------------------------------------------------------------------

def test_words_are_lowercased_stemmed_and_without_english_stop_words():
    assert tokenize(["The Quick QX9981, and a fox!"]) == [["quick", "qx9981", "fox"]]
    assert tokenize(["Printers printer's PRINTING x"]) == [["printer", "printer", "print"]]  # one letter: no word


def bm25(docs: list[list[str]], query: list[str]) -> np.ndarray:
    """BM25 as tantivy (and Lucene) computes it: k1 1.2, b 0.75, idf ln(1 + (N - n + 0.5) / (n + 0.5))."""
    n_docs, avgdl = len(docs), sum(map(len, docs)) / len(docs)
    scores = np.zeros(n_docs)
    for term in query:
        df = sum(term in d for d in docs)
        idf = math.log(1 + (n_docs - df + 0.5) / (df + 0.5))
        for j, d in enumerate(docs):
            tf = d.count(term)
            scores[j] += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(d) / avgdl)) if tf else 0
    return scores


def test_lexical_scores_are_bm25_over_the_items_and_a_deleted_item_is_never_found():
    ids = list(TEXTS)
    index = LexicalIndex()
    index.add(0, [TEXTS[i] for i in ids])
    [(scores, slots)] = index.search(["protein calcium"], 10, allowed=None)
    expected = bm25(tokenize([TEXTS[i] for i in ids]), ["protein", "calcium"])
    want = sorted(((float(s), j) for j, s in enumerate(expected) if s > 0), key=lambda p: -p[0])
    assert slots.tolist() == [j for _, j in want]  # only items sharing a word, best first
    assert np.allclose(scores, [s for s, _ in want], rtol=1e-5)
    assert ids[slots[0]] == "kinase"  # both words

    index.remove([ids.index("kinase")])
    [(_, slots)] = index.search(["protein calcium QX9981"], 10, allowed=None)
    assert [ids[s] for s in slots.tolist()] == [i for _, j in want if (i := ids[j]) != "kinase"]


def test_a_search_commits_only_the_changes_since_the_last_one():
    index = LexicalIndex()
    index.add(0, ["alpha beta", "beta gamma"])
    first = index.search(["gamma"], 5, allowed=None)
    searcher = index._searcher()
    assert first[0][1].tolist() == [1] and searcher.num_segments == 1
    assert index._searcher().num_segments == 1 and not index._pending  # no change: nothing committed
    index.add(2, ["gamma gamma delta"])
    index.remove([0])
    assert index._pending
    again = index.search(["gamma alpha"], 5, allowed=None)
    assert again[0][1].tolist() == [2, 1]
    assert index._searcher().num_segments == 2  # a segment for the new item beside the first: no rebuild
    with pytest.raises(RuntimeError, match="out of step"):
        index.add(1, ["a slot written twice"])


def test_an_allowed_set_limits_the_hits_and_an_unknown_word_finds_nothing():
    index = LexicalIndex()
    index.add(0, ["red apple", "red car", "blue car"])
    [(_, slots)] = index.search(["red"], 5, allowed=np.array([1, 2]))
    assert slots.tolist() == [1]
    [(scores, slots)] = index.search(["zebra"], 5, allowed=None)
    assert len(scores) == len(slots) == 0
    assert index.search(["red"], 5, allowed=np.array([], np.int64))[0][1].tolist() == []
    empty = LexicalIndex()
    assert empty.search(["red"], 5, None)[0][1].tolist() == []


@pytest.mark.parametrize("share", [0.01, 0.5])  # a clause of the query (few slots), or a filter on the hits
def test_a_filtered_ranking_is_the_unfiltered_one_restricted_with_ties_by_slot(share):
    rng = np.random.default_rng(3)
    words = ["amber", "basalt", "cobalt", "dune", "ember", "fjord"]
    texts = [" ".join(rng.choice(words, rng.integers(1, 4))) for _ in range(2 * TERM_SET_MAX + 500)]
    index = LexicalIndex()
    index.add(0, texts)  # many identical texts: many equal scores, ties across every cut
    allowed = np.flatnonzero(rng.random(len(texts)) < share)
    assert (len(allowed) > TERM_SET_MAX) == (share == 0.5)
    for query in (["amber", "cobalt"], words):  # some items match, or every item does
        [(all_scores, all_slots)] = index.search([" ".join(query)], len(texts), allowed=None)
        assert np.all(np.diff(all_scores) <= 0)
        assert len(all_slots) == sum(any(w in t for w in query) for t in texts)
        for a, b in zip(all_slots[:-1].tolist(), all_slots[1:].tolist()):  # ties: the earlier slot first
            assert all_scores[all_slots.tolist().index(a)] > all_scores[all_slots.tolist().index(b)] or a < b
        for k in (1, 7, 40, len(texts)):
            [(scores, slots)] = index.search([" ".join(reversed(query))], k, allowed=allowed)
            keep = np.isin(all_slots, allowed)
            assert slots.tolist() == all_slots[keep][:k].tolist()
            assert scores.tolist() == all_scores[keep][:k].tolist()


def test_reciprocal_rank_fusion_sums_weight_over_k_plus_rank():
    scores, slots = fuse([(np.array([7, 3, 5]), 1.0), (np.array([5, 9]), 0.5)], k=10, rrf_k=60)
    expected = {7: 1 / 61, 3: 1 / 62, 5: 1 / 63 + 0.5 / 61, 9: 0.5 / 62}
    assert slots.tolist() == sorted(expected, key=lambda s: -expected[s])
    assert np.allclose(scores, [expected[s] for s in slots.tolist()])
    # equal fused scores: the earlier slot first; k cuts the list
    scores, slots = fuse([(np.array([4, 2]), 1.0), (np.array([2, 4]), 1.0)], k=1, rrf_k=1)
    assert slots.tolist() == [2] and math.isclose(float(scores[0]), 1 / 2 + 1 / 3, rel_tol=1e-6)
    assert fuse([(np.array([], np.int64), 1.0)], 3, 60)[1].tolist() == []


# --- in LocalIndex ------------------------------------------------------------------------------------------

@pytest.fixture
def index():
    index = LocalIndex(background=False)
    index.create_collection(CollectionSpec("c", DIM, lexical=True))
    yield index
    index.close()


def test_lexical_search_follows_writes_deletes_replaces_and_filters(index):
    assert index.info("c").lexical
    put(index, docs("kinase", "protein", "calcium", group="bio") + docs("fox", "dog", group="animals"))
    assert lexical(index, "QX9981")[0][0][0] == "kinase"
    assert [i for i, _ in lexical(index, "lazy")[0]] == ["dog", "fox"]  # "lazy" weighs more in the shorter text
    assert [i for i, _ in lexical(index, "lazy folding", filter={"group": "bio"})[0]] == ["protein"]

    index.delete("c", ["dog"])
    assert [i for i, _ in lexical(index, "lazy")[0]] == ["fox"]
    put(index, [Document("fox", "a red fox in the snow", {"group": "animals"})])  # replaced: its old words are gone
    assert lexical(index, "lazy") == [[]]
    assert [i for i, _ in lexical(index, "snow")[0]] == ["fox"]
    index.delete("c", filter={"group": "bio"})
    assert lexical(index, "protein QX9981") == [[]]


def ranking(index: LocalIndex, *queries: str, **params) -> list[list[str]]:
    return [[i for i, _ in row] for row in lexical(index, *queries, **params)]


def test_rankings_depend_only_on_the_live_documents(index):
    """Written in several steps (one segment each, searched in between), the scores are those of a fresh index
    holding the same documents in the same order; after deletes and replaces, the rankings are at once (what the
    log's replay and a snapshot's load rebuild); the scores are once deleted items are dropped from tantivy's
    statistics, which count them until then, as Lucene's do (a background rebuild past
    SEMBED_INDEX_LEXICAL_REBUILD: tests/test_lexical_rebuild.py)."""
    queries = ["protein calcium", "lazy fox", "QX9981 kinase", "muscle"]
    fresh = LocalIndex(background=False)
    fresh.create_collection(CollectionSpec("c", DIM, lexical=True))
    put(fresh, docs(*TEXTS))
    for i in TEXTS:
        put(index, docs(i))
        lexical(index, "protein")  # commits: one more segment
    assert index._collections["c"].lexical._searcher().num_segments > 1
    assert ranking(index, *queries) == ranking(fresh, *queries)
    for row, fresh_row in zip(lexical(index, *queries), lexical(fresh, *queries)):
        assert np.allclose([s for _, s in row], [s for _, s in fresh_row], rtol=1e-6, atol=0)

    index.delete("c", ["protein"])
    put(index, [Document("calcium", "calcium and protein in muscle", {})])
    fresh.clear("c")
    put(fresh, docs("kinase", "fox", "dog") + [Document("calcium", "calcium and protein in muscle", {})])
    assert ranking(index, *queries) == ranking(fresh, *queries)
    assert any(ranking(index, *queries))
    fresh.close()


def test_a_write_is_found_by_the_next_search_while_other_searches_commit_beside_it(index):
    """Read your writes: each acknowledged write is found at once, while another thread's searches commit the
    index's pending changes concurrently with the writes (the writer and a commit share one lock)."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def searcher() -> None:
        try:
            while not stop.is_set():
                lexical(index, "note", k=3)
        except BaseException as e:  # reported below
            errors.append(e)

    thread = threading.Thread(target=searcher)
    thread.start()
    try:
        for n in range(150):
            put(index, [Document(f"d{n}", f"note {n} names w{n}x", {})] + ([] if n % 3 or not n else [
                Document(f"d{n - 1}", f"note {n - 1} renamed v{n - 1}y", {})]))
            assert [i for i, _ in lexical(index, f"w{n}x", k=1)[0]] == [f"d{n}"]
            if n % 3 == 0 and n:
                assert lexical(index, f"w{n - 1}x") == [[]]  # replaced: its old words are gone at once
                assert [i for i, _ in lexical(index, f"v{n - 1}y")[0]] == [f"d{n - 1}"]
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert len(ranking(index, "note", k=1000)[0]) == 150


def test_hybrid_fuses_the_dense_and_the_lexical_ranking(index):
    put(index, docs(*TEXTS))
    query = vec("dog" + TEXTS["dog"])[None]  # the dense ranking's first is "dog"
    dense = index.search("c", query, SearchParams(k=5))[0]
    lex = lexical(index, "QX9981")[0]
    assert dense[0].id == "dog" and [i for i, _ in lex] == ["kinase"]
    hits = index.search("c", query, SearchParams(k=5, mode="hybrid", texts=["QX9981"]))[0]
    ranks = {h.id: r for r, h in enumerate(dense, 1)}
    expected = {i: 1 / (60 + r) + (1 / 61 if i == "kinase" else 0) for i, r in ranks.items()}
    assert [h.id for h in hits] == sorted(expected, key=lambda i: -expected[i])
    assert np.allclose([h.score for h in hits], sorted(expected.values(), reverse=True))
    # weights: the lexical ranking alone decides the first place
    hits = index.search("c", query, SearchParams(k=2, mode="hybrid", texts=["QX9981"], dense_weight=0.1))[0]
    assert hits[0].id == "kinase"
    # filters apply to both rankings
    put(index, [Document("kinase", TEXTS["kinase"], {"hidden": True})])
    hits = index.search("c", query, SearchParams(k=5, mode="hybrid", texts=["QX9981"],
                                                 filter={"hidden": {"$ne": True}}))[0]
    assert "kinase" not in [h.id for h in hits] and len(hits) == 4


def test_modes_and_fusion_options_are_checked(index):
    index.create_collection(CollectionSpec("plain", DIM))
    put(index, docs("fox"), "plain")
    q = vec("x")[None]
    with pytest.raises(InvalidRequest, match="dense, lexical, sparse, hybrid"):
        index.search("c", q, SearchParams(mode="semantic"))
    with pytest.raises(InvalidRequest, match="'plain' has no lexical index"):
        index.search("plain", None, SearchParams(mode="lexical", texts=["fox"]))
    with pytest.raises(InvalidRequest, match="give the query as text"):
        index.search("c", q, SearchParams(mode="hybrid"))
    with pytest.raises(InvalidRequest, match="needs query vectors"):
        index.search("c", None, SearchParams(mode="hybrid", texts=["fox"]))
    with pytest.raises(InvalidRequest, match="dense_weight and lexical_weight cannot all be 0"):
        index.search("c", q, SearchParams(mode="hybrid", texts=["fox"], dense_weight=0, lexical_weight=0))
    with pytest.raises(InvalidRequest, match="at least 1"):
        index.search("c", q, SearchParams(mode="hybrid", texts=["fox"], rrf_k=0))
    assert index.search("plain", q, SearchParams())[0][0].id == "fox"  # dense: unchanged


def test_clear_and_a_rebuild_keep_the_lexical_index(index):
    put(index, docs("fox", "dog"))
    index.clear("c")
    assert index.info("c").lexical and lexical(index, "lazy") == [[]]
    put(index, docs("fox"))
    spec = CollectionSpec("c", DIM, lexical=True)
    index.replace_collection(spec, iter([(docs("dog", "kinase"), np.stack([vec("d"), vec("k")]))]))
    assert index.info("c").lexical and [i for i, _ in lexical(index, "lazy")[0]] == ["dog"]


def test_the_logs_replay_and_a_snapshot_rebuild_the_same_lexical_results(tmp_path):
    queries = ["protein calcium", "lazy fox", "QX9981", "snow muscle", "red"]

    def history(index: LocalIndex, part: int) -> None:
        if part == 0:
            index.create_collection(CollectionSpec("c", DIM, lexical=True))
            index.create_collection(CollectionSpec("plain", DIM))
            put(index, docs(*TEXTS, group="a"))
            put(index, docs("fox", "dog"), "plain")
            index.delete("c", ["dog"])
            put(index, [Document("calcium", "calcium in muscle and snow", {"group": "b"})])
        else:
            put(index, [Document("red", "a red fox, a red car", {"group": "b"})])
            index.delete("c", filter={"id": "protein"})
            put(index, [Document("dog", "the dog is back, lazy as ever", {"group": "a"})])

    def results(index: LocalIndex):  # rankings: scores may differ after deletes (see the test above)
        return ranking(index, *queries), ranking(index, *queries, filter={"group": "a"})

    live = LocalIndex(tmp_path / "index", background=False)
    history(live, 0)
    before_snapshot = results(live)
    live.close()
    replayed = LocalIndex(tmp_path / "index", background=False)  # the log alone
    assert results(replayed) == before_snapshot and replayed.info("c").lexical
    assert not replayed.info("plain").lexical
    replayed.snapshot()
    history(replayed, 1)
    after = results(replayed)
    replayed.close()
    reopened = LocalIndex(tmp_path / "index", background=False)  # the snapshot, then the log after it
    assert results(reopened) == after and reopened.info("c").lexical
    assert after != before_snapshot and any(after[0])
    reopened.close()


# --- over HTTP ----------------------------------------------------------------------------------------------

@pytest.fixture
def client(tmp_path):
    from tests.test_index_api import make_server

    with make_server(tmp_path) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        yield client


def test_http_lexical_collections_modes_and_their_422s(client):
    assert client.post("/collections", json={"name": "notes", "lexical": True}).json()["lexical"] is True
    assert client.post("/collections", json={"name": "plain"}).json()["lexical"] is False
    assert client.get("/collections/notes").json()["lexical"] is True
    documents = [{"id": i, "text": t, "metadata": {"n": n}} for n, (i, t) in enumerate(TEXTS.items())]
    for name in ("notes", "plain"):
        assert client.post(f"/collections/{name}/documents", json={"documents": documents}).status_code == 200

    def search(name: str = "notes", **body):
        return client.post(f"/collections/{name}/search", json={"query": "QX9981 kinase", "k": 3, **body})

    hits = search(mode="lexical").json()["results"][0]
    assert [h["id"] for h in hits] == ["kinase"] and hits[0]["score"] > 0
    hybrid = search(mode="hybrid", fusion={"k": 10, "dense_weight": 0.5, "candidates": 20}).json()["results"][0]
    assert len(hybrid) == 3 and "kinase" in [h["id"] for h in hybrid]
    assert search(mode="lexical", filter={"n": {"$gt": 0}}).json()["results"] == [[]]
    assert search().status_code == search(mode="dense").status_code == 200

    def refused(reply, *words):
        assert reply.status_code == 422, reply.text
        body = reply.json()
        assert body["error_type"] == "Validation" and all(w in body["error"] for w in words), body
        return body

    refused(search(mode="semantic"), "mode", "'dense'", "'lexical'", "'sparse'", "'hybrid'")
    refused(search("plain", mode="lexical"), "'plain' has no lexical index", "lexical\": true")
    refused(search("plain", mode="hybrid"), "no lexical index")
    refused(search(fusion={"k": 5}), "fusion applies to mode 'hybrid'")
    refused(search(mode="hybrid", fusion={"rrf": 5}), "rrf")
    refused(search(mode="hybrid", fusion={"k": 0}), "k")
    refused(search(mode="hybrid", fusion={"dense_weight": 0, "lexical_weight": 0}), "cannot all be 0")
    refused(search(mode="hybrid", fusion={"lexical_weight": -1}), "lexical_weight")
    refused(client.post("/collections/notes/search", json={"vector": [1.0] * 4, "mode": "lexical"}),
            "give query (text), not vector")
    refused(client.post("/collections", json={"name": "x", "lexical": "yes"}), "lexical")


def test_each_chunk_of_a_long_document_is_indexed_and_a_hit_is_the_document_at_its_best_chunk(index):
    text = "alpha beta gamma. " * 3 + "the zyx kinase QX9981 appears here once. " + "delta epsilon. " * 3
    cut = text.index("the zyx")
    chunked = Document("long", text, {"kind": "long"}, [(0, cut), (cut, len(text))])
    index.upsert("c", [chunked], np.stack([vec("a"), vec("b")]))
    put(index, docs("dog"))
    [[hit]] = index.search("c", None, SearchParams(k=5, mode="lexical", texts=["QX9981"]))
    assert (hit.id, hit.start, hit.end) == ("long", cut, len(text)) and hit.text == text
    [hits] = index.search("c", None, SearchParams(k=5, mode="lexical", texts=["alpha QX9981 lazy"]))
    assert sorted(h.id for h in hits) == ["dog", "long"]  # a document once, however many of its chunks match
    index.delete("c", ["long"])
    assert lexical(index, "QX9981 alpha") == [[]]
