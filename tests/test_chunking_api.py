"""Long documents over real HTTP (issue 41, point 1; fake backend: a word is a token, the window 30 words): the
documents routes chunk texts over the window, search answers documents with the best chunk's span, replace and
delete take every chunk, bad options and over-limit requests are 422s with nothing written; /embed and
/v1/embeddings chunk on request."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from tests.test_index_api import make_server

WINDOW = 30  # the fake model's max_seq_length 32 less [CLS] and [SEP]


def long_text(tag: str, sentences: int = 12) -> str:
    """Sentences of 8 words, each naming `tag` and its number: no two documents share a chunk's text."""
    return " ".join(f"{tag} sentence {i} has some more words here." for i in range(sentences))


@pytest.fixture
def server(tmp_path):
    with make_server(tmp_path, max_request_chunks=40) as live:
        with httpx.Client(base_url=live.url, timeout=30) as client:
            live.client = client
            yield live


def chunk_spans(c: httpx.Client, text: str, **options) -> list[tuple[int, int]]:
    reply = c.post("/embed", json={"inputs": text, "chunking": options or True})
    assert reply.status_code == 200, reply.text
    return [(chunk["start"], chunk["end"]) for chunk in reply.json()[0]]


def test_a_long_document_is_found_by_its_tail_at_its_span(server):
    c = server.client
    text = long_text("alpha")
    docs = [{"id": "long", "text": text, "metadata": {"kind": "long"}},
            *({"id": f"s{i}", "text": f"short text {i}"} for i in range(5))]
    added = c.post("/index/documents", json={"documents": docs}).json()
    assert (added["added"], added["total"]) == (6, 6)  # documents, however many chunks
    spans = chunk_spans(c, text)
    assert len(spans) >= 4 and spans[-1][1] == len(text)
    assert all(len(text[a:b].split()) <= WINDOW for a, b in spans)
    tail = text[spans[-1][0]: spans[-1][1]]  # past the window: truncation would never have embedded it
    assert spans[-1][0] > len(" ".join(text.split()[:WINDOW]))
    hits = c.post("/search", json={"query": tail, "k": 3, "chunks": True}).json()["results"][0]
    assert hits[0]["id"] == "long" and (hits[0]["start"], hits[0]["end"]) == spans[-1]
    assert hits[0]["score"] == pytest.approx(1.0, abs=1e-5) and hits[0]["text"] == text
    assert hits[0]["chunks"][0] == {"start": spans[-1][0], "end": spans[-1][1], "score": hits[0]["score"]}
    assert {(ch["start"], ch["end"]) for ch in hits[0]["chunks"]} <= set(spans)
    assert [h["id"] for h in hits].count("long") == 1 and len(hits) == 3
    short = next(h for h in hits if h["id"] != "long")
    assert (short["start"], short["end"]) == (0, len(short["text"]))
    got = c.post("/collections/default/documents/get", json={"ids": ["long"]}).json()["documents"]
    assert [d["text"] for d in got] == [text]  # the document whole, not a chunk


def test_chunking_false_truncates_as_before(server):
    c = server.client
    text = long_text("beta")
    c.post("/index/documents", json={"documents": [{"id": "cut", "text": text}], "chunking": False})
    tail = text[chunk_spans(c, text)[-1][0]:]
    hit = c.post("/search", json={"query": tail, "k": 1}).json()["results"][0][0]
    assert hit["id"] == "cut" and (hit["start"], hit["end"]) == (0, len(text))
    assert hit["score"] < 0.99  # its one vector is of the first 30 words


def test_replacing_and_deleting_a_document_takes_all_its_chunks(server):
    c = server.client
    old = long_text("gamma", 16)
    c.post("/collections", json={"name": "notes"})
    c.post("/collections/notes/documents", json={"documents": [{"id": "doc", "text": old},
                                                                {"id": "other", "text": "other words"}]})
    old_tail = old[chunk_spans(c, old)[-1][0]:]
    new = "a much shorter replacement text"
    assert c.post("/collections/notes/documents", json={"documents": [{"id": "doc", "text": new}]}).json()["total"] == 2
    hits = c.post("/collections/notes/search", json={"query": old_tail, "k": 5, "chunks": True}).json()["results"][0]
    by_id = {h["id"]: h for h in hits}
    assert set(by_id) == {"doc", "other"} and by_id["doc"]["chunks"] == [
        {"start": 0, "end": len(new), "score": by_id["doc"]["score"]}]  # the old chunks are gone
    assert by_id["doc"]["text"] == new and by_id["doc"]["score"] < 0.99
    # chunked again, then deleted: no chunk of it is found afterwards
    c.post("/collections/notes/documents", json={"documents": [{"id": "doc", "text": old}]})
    deleted = c.delete("/collections/notes/documents/doc").json()
    assert (deleted["deleted"], deleted["total"]) == (1, 1)
    hits = c.post("/collections/notes/search", json={"query": old_tail, "k": 5}).json()["results"][0]
    assert [h["id"] for h in hits] == ["other"]
    assert c.get("/collections/notes").json()["count"] == 1


@pytest.mark.parametrize("chunking, message", [
    ({"size": 4}, "chunking size=4 is out of range: 8 to 30 tokens"),
    ({"size": 31}, "chunking size=31 is out of range: 8 to 30 tokens"),
    ({"size": 20, "overlap": 11}, "chunking overlap=11 is out of range: 0 to 10 tokens"),
    ({"mode": "html"}, "Input should be 'text' or 'markdown'"),
    ({"sizes": 20}, "Extra inputs are not permitted"),
    (1, "Input should be a valid boolean"),
])
def test_bad_chunking_options_are_422s_naming_the_options(server, chunking, message):
    c = server.client
    for path, body in (("/index/documents", {"documents": [{"id": "x", "text": long_text("d")}]}),
                       ("/embed", {"inputs": long_text("d")}),
                       ("/v1/embeddings", {"input": long_text("d")})):
        reply = c.post(path, json={**body, "chunking": chunking})
        assert reply.status_code == 422, (path, reply.text)
        assert message in reply.text, (path, reply.text)
    assert c.get("/collections/default").json()["count"] == 0


def test_a_request_over_the_chunk_limit_is_refused_whole(server):
    c = server.client
    c.post("/index/documents", json={"documents": [{"id": "keep", "text": "kept text"}]})
    before = c.get("/collections/default").json()
    docs = [{"id": f"d{i}", "text": long_text(f"d{i}", 24)} for i in range(6)]  # 6 × about 10 chunks > 40
    reply = c.post("/index/documents", json={"documents": [{"id": "keep", "text": "replaced"}, *docs]})
    assert reply.status_code == 422, reply.text
    # documents[0] is the short one; the long ones make about 9 chunks each: documents[5] goes over
    assert re.match(r"documents\[5\] brings this request to 4\d chunks; the limit \(max_request_chunks\) is 40",
                    reply.json()["error"]), reply.text
    after = c.get("/collections/default").json()
    assert (after["count"], after["sequence"]) == (before["count"], before["sequence"])  # nothing written
    assert c.get("/collections/default/documents/keep").json()["text"] == "kept text"
    assert c.post("/embed", json={"inputs": [d["text"] for d in docs], "chunking": True}).status_code == 422


def test_a_vectors_only_collection_refuses_chunking(server):
    c = server.client
    c.post("/collections", json={"name": "vecs", "vectors_only": True, "dimension": 8})
    reply = c.post("/collections/vecs/documents", json={"documents": [{"id": "v", "vector": [1.0] * 8}],
                                                         "chunking": True})
    assert reply.status_code == 422 and "chunking applies to texts the service embeds" in reply.text
    # unset: its documents bring their vectors, as before
    assert c.post("/collections/vecs/documents", json={"documents": [{"id": "v", "vector": [1.0] * 8}]}).json()[
        "added"] == 1


def test_embed_with_chunking_gives_vectors_per_chunk_with_spans(server):
    c = server.client
    text = long_text("delta")
    plain = c.post("/embed", json={"inputs": [text, "short"]}).json()
    assert len(plain) == 2 and isinstance(plain[0][0], float)  # unchanged without chunking
    chunked = c.post("/embed", json={"inputs": [text, "short"], "chunking": {"size": 20, "overlap": 4}}).json()
    assert len(chunked) == 2 and chunked[1] == [{"start": 0, "end": 5, "embedding": plain[1]}]
    assert len(chunked[0]) > 4 and all(len(text[ch["start"]: ch["end"]].split()) <= 20 for ch in chunked[0])
    piece = chunked[0][2]  # a chunk's vector is its text's
    assert c.post("/embed", json={"inputs": text[piece["start"]: piece["end"]]}).json()[0] == piece["embedding"]
    # the first chunk is the truncated text's first words, no more
    assert chunked[0][0]["start"] == 0 and chunked[0][0]["end"] < len(text)


def test_openai_embeddings_with_chunking_through_the_openai_client(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    text = long_text("epsilon")
    reply = client.embeddings.create(input=[text, "short"], model="main", extra_body={"chunking": {"size": 16}})
    rows = [(d.index, d.model_extra["start"], d.model_extra["end"]) for d in reply.data]
    assert rows[-1] == (1, 0, 5) and rows[0][:2] == (0, 0) and len(rows) > 5
    assert all(len(text[a:b].split()) <= 16 for i, a, b in rows if i == 0)
    plain = client.embeddings.create(input=[text, "short"], model="main")
    assert [d.index for d in plain.data] == [0, 1] and plain.data[0].model_extra == {}
