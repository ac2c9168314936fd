"""Lexical (BM25) indexes beside a collection's vectors, and hybrid search by reciprocal rank fusion (issue 41):
the index alone, in LocalIndex (writes, deletes, replaces, filters, the log's replay and snapshots), and over
real HTTP (fake backend) for the options and their 422s."""

from __future__ import annotations

import math

import bm25s
import httpx
import numpy as np
import pytest

from service.index import CollectionSpec, Document, InvalidRequest, LocalIndex, SearchParams
from service.index.lexical import LexicalIndex, fuse, tokenize

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

def test_tokens_are_lowercased_words_without_english_stop_words():
    assert tokenize(["The Quick QX9981, and a fox!"]) == [["quick", "qx9981", "fox"]]


def test_lexical_scores_are_bm25s_scores_over_the_live_items():
    ids = list(TEXTS)
    index = LexicalIndex()
    index.add(0, [TEXTS[i] for i in ids])
    live = np.ones(len(ids), bool)
    live[ids.index("fox")] = False  # a deleted item counts in no statistic
    [(scores, slots)] = index.search(["protein calcium"], 10, version=1, live=lambda n: live[:n], allowed=None)

    kept = [i for i in ids if i != "fox"]
    reference = bm25s.BM25(method="lucene")
    reference.index(tokenize([TEXTS[i] for i in kept]), show_progress=False)
    expected = reference.get_scores(["protein", "calcium"])
    want = sorted(((float(s), kept[j]) for j, s in enumerate(expected) if s > 0), key=lambda p: -p[0])
    assert [ids[s] for s in slots.tolist()] == [i for _, i in want]  # only items sharing a term, best first
    assert np.allclose(scores, [s for s, _ in want])
    assert [ids[s] for s in slots.tolist()][0] == "kinase"  # both terms


def test_the_lexical_index_is_built_again_only_after_a_change():
    index = LexicalIndex()
    index.add(0, ["alpha beta", "beta gamma"])
    live = np.ones(3, bool)
    first = index.search(["gamma"], 5, version=1, live=lambda n: live[:n], allowed=None)
    built = index._built
    assert index.search(["gamma"], 5, version=1, live=lambda n: live[:n], allowed=None)[0][1].tolist() == [1]
    assert index._built is built  # the same version: the same structure
    index.add(2, ["gamma gamma delta"])
    again = index.search(["gamma"], 5, version=2, live=lambda n: live[:n], allowed=None)
    assert index._built is not built and again[0][1].tolist() == [2, 1] and first[0][1].tolist() == [1]
    with pytest.raises(RuntimeError, match="out of step"):
        index.add(1, ["a slot written twice"])


def test_an_allowed_set_limits_the_hits_and_an_unknown_word_finds_nothing():
    index = LexicalIndex()
    index.add(0, ["red apple", "red car", "blue car"])
    live = np.ones(3, bool)
    [(_, slots)] = index.search(["red"], 5, 1, lambda n: live[:n], allowed=np.array([1, 2]))
    assert slots.tolist() == [1]
    [(scores, slots)] = index.search(["zebra"], 5, 1, lambda n: live[:n], allowed=None)
    assert len(scores) == len(slots) == 0
    empty = LexicalIndex()
    assert empty.search(["red"], 5, 0, lambda n: live[:n], None)[0][1].tolist() == []


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


def test_scores_depend_only_on_the_live_documents(index):
    """After deletes and replaces, the scores are those of a fresh index holding the same documents in the same
    order: what the log's replay and a snapshot's load rebuild."""
    put(index, docs(*TEXTS))
    index.delete("c", ["protein"])
    put(index, [Document("calcium", "calcium and protein in muscle", {})])
    fresh = LocalIndex(background=False)
    fresh.create_collection(CollectionSpec("c", DIM, lexical=True))
    put(fresh, docs("kinase", "fox", "dog") + [Document("calcium", "calcium and protein in muscle", {})])
    queries = ["protein calcium", "lazy fox", "QX9981 kinase", "muscle"]
    assert lexical(index, *queries) == lexical(fresh, *queries)
    fresh.close()


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
    with pytest.raises(InvalidRequest, match="dense, lexical, hybrid"):
        index.search("c", q, SearchParams(mode="sparse"))
    with pytest.raises(InvalidRequest, match="'plain' has no lexical index"):
        index.search("plain", None, SearchParams(mode="lexical", texts=["fox"]))
    with pytest.raises(InvalidRequest, match="give the query as text"):
        index.search("c", q, SearchParams(mode="hybrid"))
    with pytest.raises(InvalidRequest, match="needs query vectors"):
        index.search("c", None, SearchParams(mode="hybrid", texts=["fox"]))
    with pytest.raises(InvalidRequest, match="not both 0"):
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

    def results(index: LocalIndex):
        return lexical(index, *queries), lexical(index, *queries, filter={"group": "a"})

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

    refused(search(mode="sparse"), "mode", "'dense'", "'lexical'", "'hybrid'")
    refused(search("plain", mode="lexical"), "'plain' has no lexical index", "lexical\": true")
    refused(search("plain", mode="hybrid"), "no lexical index")
    refused(search(fusion={"k": 5}), "fusion applies to mode 'hybrid'")
    refused(search(mode="hybrid", fusion={"rrf": 5}), "rrf")
    refused(search(mode="hybrid", fusion={"k": 0}), "k")
    refused(search(mode="hybrid", fusion={"dense_weight": 0, "lexical_weight": 0}), "not both be 0")
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
