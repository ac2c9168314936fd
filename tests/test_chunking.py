"""Long documents as chunks (issue 41): the splitter over the model's own tokenizer, and the local index storing a
document as its chunks (search collapses them, replace and delete take all of them, the log and snapshots keep
them whole, and logs written before chunking replay)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service import chunking
from service.index import CollectionSpec, Document, InvalidRequest, LocalIndex, SearchParams
from service.index.local import _encode
from service.index.wal import WriteAheadLog
from service.tokenization import Tokenizer, WordTokenizer

SENTENCES = [f"Sentence number {i} talks about topic {i % 7} at some length here." for i in range(120)]
LONG = " ".join(SENTENCES)


@pytest.fixture(scope="module")
def tokenizer(default_export) -> Tokenizer:
    return Tokenizer(default_export)


def test_a_long_text_is_cut_into_token_windows_at_sentence_ends(tokenizer):
    limit = chunking.window(tokenizer.max_seq_length, tokenizer.special_tokens)
    assert limit == tokenizer.max_seq_length - 2  # [CLS] and [SEP]
    options = chunking.resolve(limit, size=64, overlap=16)
    spans = chunking.spans(tokenizer.splitters.get(options), LONG)
    assert len(spans) > 10
    raw = tokenizer.splitters.get(options)  # the same splitter object is reused
    assert raw is tokenizer.splitters.get(chunking.ChunkOptions(64, 16))
    for (start, end), (next_start, _) in zip(spans, spans[1:]):
        piece = LONG[start:end]
        assert len(tokenizer._full.encode(piece, add_special_tokens=False).ids) <= 64
        assert piece.endswith("."), piece[-30:]  # cut at a sentence end, the nearest one under the window
        assert start < next_start < end  # consecutive chunks overlap, and move on
    assert spans[0][0] == 0 and spans[-1][1] == len(LONG)
    covered = np.zeros(len(LONG), bool)
    for start, end in spans:
        covered[start:end] = True
    assert covered[[i for i, c in enumerate(LONG) if not c.isspace()]].all()  # no text is left out


def test_a_text_that_fits_is_one_chunk_spanning_all_of_it(tokenizer):
    options = chunking.resolve(254)
    for text in ["  a short text with spaces around  ", "x", ""]:
        assert chunking.spans(tokenizer.splitters.get(options), text) == [(0, len(text))]


def test_spans_are_character_offsets_in_text_beyond_ascii(tokenizer):
    text = " ".join(f"Ünïcödé sentence {i} says ça va très bien." for i in range(40))
    spans = chunking.spans(tokenizer.splitters.get(chunking.resolve(254, size=24, overlap=0)), text)
    assert len(spans) > 3
    assert all(text[a:b].startswith("Ünïcödé") and text[a:b].endswith(".") for a, b in spans)


def test_the_fake_tokenizer_counts_words():
    word = WordTokenizer(max_seq_length=32)
    spans = chunking.spans(word.splitters.get(chunking.resolve(30)), " ".join(str(i) for i in range(100)))
    assert [len(" ".join(str(i) for i in range(100))[a:b].split()) <= 30 for a, b in spans] == [True] * len(spans)
    assert len(spans) >= 4


@pytest.mark.parametrize("size, overlap, mode, message", [
    (7, None, "text", "size=7 is out of range: 8 to 254"),
    (255, None, "text", "size=255 is out of range: 8 to 254"),
    (64, 33, "text", "overlap=33 is out of range: 0 to 32"),
    (64, -1, "text", "overlap=-1 is out of range"),
    (None, None, "html", "mode 'html' is not known: use one of text, markdown"),
])
def test_options_out_of_range_are_refused_naming_the_range(size, overlap, mode, message):
    with pytest.raises(chunking.ChunkingRefused, match=message):
        chunking.resolve(254, size, overlap, mode)


def test_defaults_follow_the_window_and_settings():
    assert chunking.resolve(254) == chunking.ChunkOptions(254, 32, "text")
    assert chunking.resolve(254, default_size=100, default_overlap=40) == chunking.ChunkOptions(100, 25, "text")
    assert chunking.resolve(30) == chunking.ChunkOptions(30, 7, "text")  # overlap: at most a quarter
    assert chunking.resolve(254, default_size=1000).size == 254  # never past the window


# --- the local index ----------------------------------------------------------------------------------

def _unit(rng, n, dim=8):
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _chunked(doc_id, n, metadata=None):
    text = "".join(f"part {i}. " for i in range(n))
    return Document(doc_id, text, metadata or {}, [(8 * i, 8 * i + 7) for i in range(n)])


def test_search_answers_documents_at_their_best_chunk():
    rng = np.random.default_rng(0)
    index = LocalIndex(None)
    index.create_collection(CollectionSpec("c", 8))
    long, vectors = _chunked("long", 6, {"kind": "long"}), _unit(rng, 6)
    others = [Document(f"s{i}", f"short {i}", {"kind": "short"}) for i in range(30)]
    index.upsert("c", [long, *others], np.vstack([vectors, _unit(rng, 30)]))
    assert index.info("c").count == 31  # documents, not chunks
    # a query at the long document's 5th chunk finds it there, with its span and score, and once only
    hits = index.search("c", vectors[4:5], SearchParams(k=31, with_chunks=True))[0]
    assert hits[0].id == "long" and (hits[0].start, hits[0].end) == (32, 39)
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert [h.id for h in hits].count("long") == 1 and len(hits) == 31
    assert sorted((a, b) for a, b, _ in hits[0].chunks) == long.spans()  # every chunk matched: k covers all
    assert [s for *_, s in hits[0].chunks] == sorted((s for *_, s in hits[0].chunks), reverse=True)
    assert hits[1].chunks == [(0, len(hits[1].text), hits[1].score)]
    # k documents come back even where one document's chunks fill the first k × chunks candidates
    assert len(index.search("c", vectors[4:5], SearchParams(k=3))[0]) == 3
    # a filter and a threshold apply to the chunks: the long document is found at its best allowed chunk
    assert [h.id for h in index.search("c", vectors[4:5], SearchParams(k=5, filter={"kind": "long"}))[0]] == ["long"]
    assert index.search("c", vectors[4:5], SearchParams(k=5, score_threshold=0.999))[0][0].id == "long"


def test_many_long_documents_still_give_k_documents():
    rng = np.random.default_rng(1)
    index = LocalIndex(None)
    index.create_collection(CollectionSpec("c", 8))
    docs = [_chunked(f"d{i}", 2 + i % 9) for i in range(40)]
    vectors = _unit(rng, sum(d.rows for d in docs))
    index.upsert("c", docs, vectors)
    query = _unit(rng, 1)
    hits = index.search("c", query, SearchParams(k=25))[0]
    assert len({h.id for h in hits}) == 25
    # the exact answer: each document's best chunk, ranked
    best, row = {}, 0
    for d in docs:
        best[d.id] = float((vectors[row: row + d.rows] @ query[0]).max())
        row += d.rows
    assert [h.id for h in hits] == sorted(best, key=best.get, reverse=True)[:25]


def test_replacing_or_deleting_a_document_takes_all_its_chunks():
    rng = np.random.default_rng(2)
    index = LocalIndex(None)
    index.create_collection(CollectionSpec("c", 8))
    index.upsert("c", [_chunked("a", 5, {"g": 1}), _chunked("b", 3, {"g": 2})], _unit(rng, 8))
    replaced = _unit(rng, 2)
    index.upsert("c", [_chunked("a", 2, {"g": 1})], replaced)  # fewer chunks now
    probe = index.search("c", replaced[1:2], SearchParams(k=10, with_chunks=True))[0]
    assert [(h.id, len(h.chunks)) for h in probe] == [("a", 2), ("b", 3)]
    assert index.get("c", ["a"])[0].text == _chunked("a", 2).text
    assert index.delete("c", filter={"g": 2}).count == 1  # one document, three chunks
    assert [h.id for h in index.search("c", replaced[:1], SearchParams(k=10))[0]] == ["a"]
    assert index.delete("c", ids=["a"]).count == 1 and index.info("c").count == 0
    assert index.search("c", replaced[:1], SearchParams(k=10))[0] == []


def test_a_write_with_the_wrong_number_of_vectors_or_bad_spans_is_refused_whole():
    index = LocalIndex(None)
    index.create_collection(CollectionSpec("c", 8))
    rng = np.random.default_rng(3)
    with pytest.raises(InvalidRequest, match=r"shape \(4, 8\)"):
        index.upsert("c", [_chunked("a", 3), Document("b", "x")], _unit(rng, 3))
    with pytest.raises(InvalidRequest, match="not a \\[start, end\\] span inside its text"):
        index.upsert("c", [Document("a", "short", {}, [(0, 3), (2, 9)])], _unit(rng, 2))
    with pytest.raises(InvalidRequest, match="a list of 1 to"):
        index.upsert("c", [Document("a", "short", {}, [])], _unit(rng, 0))
    assert index.info("c").count == 0


def test_chunks_survive_the_log_and_snapshots(tmp_path):
    rng = np.random.default_rng(4)
    index = LocalIndex(tmp_path)
    index.create_collection(CollectionSpec("c", 8))
    first = _unit(rng, 5)
    index.upsert("c", [_chunked("a", 4), Document("b", "short")], first)
    index.snapshot()
    later = _unit(rng, 3)
    index.upsert("c", [_chunked("a", 3)], later)  # in the log after the snapshot
    index.close()
    reopened = LocalIndex(tmp_path)
    hits = reopened.search("c", later[2:3], SearchParams(k=5, with_chunks=True))[0]
    assert [(h.id, len(h.chunks)) for h in hits] == [("a", 3), ("b", 1)]
    assert (hits[0].start, hits[0].end) == (16, 23)
    assert [r.spans for r in next(iter(reopened.scan("c", 10)))] == [None, _chunked("a", 3).spans()]
    reopened.snapshot()  # a snapshot of chunks, loaded on its own
    reopened.close()
    again = LocalIndex(tmp_path)
    assert [(h.id, h.start) for h in again.search("c", later[2:3], SearchParams(k=5))[0]] == [("a", 16), ("b", 0)]
    again.close()


def test_a_log_written_before_chunking_replays(tmp_path):
    """Records and snapshot lines of three fields, [id, text, metadata], are one chunk each."""
    index = LocalIndex(tmp_path)
    index.create_collection(CollectionSpec("c", 4))
    index.close()
    wal = WriteAheadLog(tmp_path / "wal")
    assert len(list(wal.replay(0))) == 1  # the create record
    wal.open()
    vectors = np.eye(4, dtype=np.float32)[:2]
    op = {"op": "upsert", "c": "c", "docs": [["a", "old text", {"x": 1}], ["b", "other", {}]]}
    wal.append(_encode(op, vectors.tobytes()))
    wal.sync()
    wal.close()
    reopened = LocalIndex(tmp_path)
    hit = reopened.search("c", vectors[1:2], SearchParams(k=1))[0][0]
    assert (hit.id, hit.start, hit.end) == ("b", 0, 5)
    reopened.snapshot()
    reopened.close()
    lines = [json.loads(line) for line in next((tmp_path / "snapshots").iterdir()).joinpath("0.docs.jsonl").open()]
    assert lines == [["a", "old text", {"x": 1}], ["b", "other", {}]]  # unchunked documents keep that format


def test_re_embedding_embeds_each_chunk_again_at_its_span():
    from service.index import ModelStamp
    from service.index.reembed import reembed

    rng = np.random.default_rng(5)
    index = LocalIndex(None)
    index.create_collection(CollectionSpec("c", 8, model=ModelStamp("old", "1")))
    long = _chunked("a", 4)
    index.upsert("c", [long, Document("b", "short")], _unit(rng, 5))
    embedded: list[str] = []

    def embed(texts: list[str]) -> np.ndarray:
        embedded.extend(texts)
        return _unit(rng, len(texts))

    assert reembed(index, "c", ModelStamp("new", "2"), 8, embed).total == 2
    assert embedded == [long.text[a:b] for a, b in long.spans()] + ["short"]
    hits = index.search("c", _unit(rng, 1), SearchParams(k=2, with_chunks=True))[0]
    assert sorted((h.id, len(h.chunks)) for h in hits) == [("a", 4), ("b", 1)]
    assert index.info("c").model == ModelStamp("new", "2")
