"""A lexical index is rebuilt from the live items once deleted ones pass SEMBED_INDEX_LEXICAL_REBUILD of it (issue
41): tantivy's BM25 statistics count a deleted or replaced item until then. After the rebuild the scores are those
of an index written fresh with the same live items, and those after a restart; writes made while a rebuild runs in
the background are in the index it swaps in."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from service.index import CollectionSpec, Document, LocalIndex, SearchParams
from service.index.lexical import SWAP_TAIL, LexicalIndex

DIM = 8
WORDS = [f"w{n}" for n in range(30)]
QUERIES = ["w1 w2", "w3", "w4 w5 w6", "w7 w29", "w10 w20 w0"]


def text(seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, int(rng.integers(3, 12))))


def write(index: LocalIndex, texts: dict[str, str]) -> None:
    ids = list(texts)
    vectors = np.random.default_rng(len(ids)).normal(size=(len(ids), DIM)).astype(np.float32)
    index.upsert("c", [Document(i, texts[i], {}) for i in ids], vectors / np.linalg.norm(vectors, axis=1)[:, None])


def scores(index: LocalIndex) -> list[dict[str, float]]:
    hits = index.search("c", None, SearchParams(k=100, mode="lexical", texts=QUERIES))
    return [{h.id: h.score for h in row} for row in hits]


def same(a: list[dict[str, float]], b: list[dict[str, float]]) -> bool:
    return all(x.keys() == y.keys() and np.allclose([x[i] for i in x], [y[i] for i in x], rtol=1e-6, atol=0)
               for x, y in zip(a, b))


def opened(path=None, **options) -> LocalIndex:
    index = LocalIndex(path, background=False, **options)
    if "c" not in [c.name for c in index.list_collections()]:
        index.create_collection(CollectionSpec("c", DIM, lexical=True))
    return index


def fresh(live: dict[str, str]) -> list[dict[str, float]]:
    index = opened()
    write(index, live)
    try:
        return scores(index)
    finally:
        index.close()


def test_after_replacing_most_documents_the_scores_are_a_fresh_index_s_and_a_restart_s(tmp_path):
    original = {f"d{n}": text(n) for n in range(40)}
    replaced = {f"d{n}": text(1000 + n) for n in range(40) if n % 4}  # a quarter of each segment stays
    live = original | replaced

    def history(index: LocalIndex) -> None:
        for start in range(0, 40, 10):  # a segment per write
            write(index, dict(list(original.items())[start: start + 10]))
            scores(index)
        write(index, replaced)  # 30 of 70 items indexed are now deleted: over a quarter

    never = opened(lexical_rebuild=1.0)  # what the index did before: the deleted items stay in the statistics
    history(never)
    assert never._collections["c"].lexical.deleted == 30
    assert not same(scores(never), fresh(live))  # so this test can tell
    never.close()

    index = opened(tmp_path / "index")
    history(index)
    assert index._collections["c"].lexical.deleted == 0
    after = scores(index)
    assert same(after, fresh(live)) and all(after)
    index.close()
    replayed = opened(tmp_path / "index")  # the log's replay: the same writes, the same rebuild
    assert same(scores(replayed), after)
    replayed.snapshot()
    replayed.close()
    loaded = opened(tmp_path / "index")  # a snapshot's load: the live items only
    assert same(scores(loaded), after)
    loaded.close()


def test_below_the_threshold_nothing_is_rebuilt_and_at_0_every_delete_rebuilds():
    texts = {f"d{n}": text(n) for n in range(20)}
    quarter = opened()
    write(quarter, texts)
    quarter.delete("c", ["d0", "d1", "d2", "d3", "d4"])  # 5 of 20: not over a quarter
    assert quarter._collections["c"].lexical.deleted == 5
    quarter.delete("c", ["d5"])  # 6 of 20
    assert quarter._collections["c"].lexical.deleted == 0
    quarter.close()

    every = opened(lexical_rebuild=0.0)
    write(every, texts)
    live = dict(texts)
    for n in range(0, 20, 3):  # replaces and deletes, one at a time
        if n % 2:
            live.pop(f"d{n}")
            every.delete("c", [f"d{n}"])
        else:
            live[f"d{n}"] = text(500 + n)
            write(every, {f"d{n}": live[f"d{n}"]})
        assert every._collections["c"].lexical.deleted == 0
        assert same(scores(every), fresh(live))
    every.close()
    with pytest.raises(ValueError, match="between 0 and 1"):
        LocalIndex(lexical_rebuild=1.5)


def test_writes_during_a_background_rebuild_are_in_the_index_it_swaps_in():
    """The index's owner (this thread) adds and removes while the builder waits, first before it reads the live
    items, then after (so a removed item is left out, or deleted by the journal's replay: more changes than it
    applies under the lock), then adds while it replays the journal; every write is found at once throughout."""
    live: dict[int, str] = {}
    read_now, was_read, build_now, asked = (threading.Event() for _ in range(4))
    snapshot: list[int] = []

    def live_items(end: int) -> tuple[list[int], list[str]]:
        asked.set()
        read_now.wait(30)
        slots = sorted(s for s in live if s < end)
        texts = [live[s] for s in slots]
        snapshot.extend(slots)
        was_read.set()
        build_now.wait(30)
        return slots, texts

    index = LexicalIndex(live_items, rebuild_at=0.0)
    next_slot = 0

    def add(*texts: str) -> None:
        nonlocal next_slot
        index.add(next_slot, texts)
        live.update(enumerate(texts, next_slot))
        next_slot += len(texts)

    def remove(*slots: int) -> None:  # gone from the live items first, as a collection's documents are
        for s in slots:
            del live[s]
        index.remove(slots)

    def found(word: str) -> list[int]:
        return sorted(index.search([word], 1000, None)[0][1].tolist())

    add(*(f"note alpha u{n}" for n in range(40)))
    removed_after_start: set[int] = set()
    remove(0)  # the first delete: a rebuild starts
    assert asked.wait(30)
    for n in range(1, 6):  # before the builder reads: left out of what it reads
        remove(n)
        removed_after_start.add(n)
    add("note beta v0")
    read_now.set()
    assert was_read.wait(30)
    for n in range(6, 12):  # after it read them: deleted by the journal's replay
        remove(n)
        removed_after_start.add(n)
        assert found(f"u{n}") == []
    for n in range(1, SWAP_TAIL + 40):  # more than it applies under the lock
        add(f"note beta v{n}")
        assert found(f"v{n}") == [next_slot - 1]
    build_now.set()
    for n in range(12, 30):  # while it replays: the journal grows, or the new index takes them directly (adds
        add(f"note gamma x{n}")  # only: a delete after the swap would start the next rebuild)
        assert found(f"x{n}") == [next_slot - 1]
    index.wait()
    assert found("note") == sorted(live)  # every live item, nothing else
    in_new_index = set(snapshot) | set(range(40, next_slot))
    assert index.deleted == len(removed_after_start & in_new_index)

    remove(30)  # the next delete starts the next rebuild, with no write beside it: the live items alone
    index.wait()
    assert index.deleted == 0 and found("note") == sorted(live)
    clean = LexicalIndex()
    slots = sorted(live)
    clean.add(0, [live[s] for s in slots])
    for query in ("note alpha", "beta gamma x20", "u35 v3"):
        [(got, got_slots)] = index.search([query], 1000, None)
        [(want, want_slots)] = clean.search([query], 1000, None)
        assert np.allclose(got, want, rtol=1e-6, atol=0)
        assert sorted(got_slots.tolist()) == sorted(slots[i] for i in want_slots.tolist())


def test_a_rebuild_beside_concurrent_writes_and_searches_in_a_collection():
    """Background rebuilds in a real collection (its live items read by the builder thread while the committer
    writes), with a search thread beside them: each acknowledged write is found at once, each replaced text gone."""
    DOCS = 60  # noqa: N806 - a rebuild starts as each quarter of them is replaced: several a round
    index = LocalIndex()
    index.create_collection(CollectionSpec("c", DIM, lexical=True))
    write(index, {f"d{n}": f"note d{n} first{n}" for n in range(DOCS)})
    stop = threading.Event()
    errors: list[BaseException] = []

    def searcher() -> None:
        try:
            while not stop.is_set():
                index.search("c", None, SearchParams(k=5, mode="lexical", texts=["note"]))
        except BaseException as e:  # reported below
            errors.append(e)

    def ids(word: str) -> list[str]:
        return [h.id for h in index.search("c", None, SearchParams(k=1000, mode="lexical", texts=[word]))[0]]

    thread = threading.Thread(target=searcher)
    thread.start()
    try:
        for round_ in range(3):
            for n in range(DOCS):  # every document replaced: rebuilds start as deleted items pass a quarter
                write(index, {f"d{n}": f"note d{n} round{round_}x{n}"})
                assert ids(f"round{round_}x{n}") == [f"d{n}"]
                assert ids(f"first{n}") == [] and (round_ == 0 or ids(f"round{round_ - 1}x{n}") == [])
    finally:
        stop.set()
        thread.join()
    assert not errors
    lexical = index._collections["c"].lexical
    lexical.wait()
    assert lexical.deleted < DOCS  # rebuilt: else each of the 3 x DOCS replaced texts would still be counted
    assert sorted(ids("note")) == sorted(f"d{n}" for n in range(DOCS))
    index.close()
