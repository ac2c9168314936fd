"""The index process's server and client (service/index/remote.py) over real ZeroMQ sockets and a real LocalIndex:
every VectorIndex call the API processes make crosses as its typed message (service/index/messages.py), errors as
the same classes, and a message that is none of them is refused with a clear answer and logged, never dispatched,
while the server goes on serving. The index process itself is covered end to end by tests/test_processes.py."""

from __future__ import annotations

import asyncio
import logging
import threading

import msgpack
import msgspec
import numpy as np
import pytest
import zmq

from service.index import base
from service.index import messages as m
from service.index.local import LocalIndex
from service.index.reembed import reembed
from service.index.remote import IndexClient, IndexServer


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture
def served(tmp_path):
    """An IndexServer on its own event loop thread over a LocalIndex, and a client of it."""
    index = LocalIndex(tmp_path / "index", background=False)
    endpoint = f"ipc://{tmp_path}/index.sock"
    server = IndexServer(index, endpoint, threads=2)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    client = IndexClient(endpoint, timeout_s=20)
    yield index, client, endpoint
    client.close()
    loop.call_soon_threadsafe(server.stop)
    thread.join(20)
    index.close()


def test_every_call_crosses_with_its_results_and_errors(served):
    _, client, _ = served
    spec = base.CollectionSpec("docs", 4, model=base.ModelStamp("m", "ab" * 32), lexical=True)
    info = client.create_collection(spec)
    assert (info.name, info.dimension, info.model, info.lexical) == ("docs", 4, spec.model, True)
    with pytest.raises(base.CollectionExists):
        client.create_collection(spec)
    vectors = unit(np.random.default_rng(0).standard_normal((3, 4)))
    docs = [base.Document("a", "red apple pie", {"n": 1}), base.Document("b", "green pear", {"n": 2}),
            base.Document("c", "a long text in two chunks", {"n": 3, "tags": ["x"]}, [(0, 6), (7, 25)])]
    written = client.upsert("docs", docs, np.vstack([vectors, vectors[2:]]))
    assert (written.count, written.total) == (3, 3) and written.sequence > 0
    assert [c.name for c in client.list_collections()] == ["docs"]
    assert client.info("docs").count == 3

    records = client.get("docs", ["c", "missing", "a"], with_vector=True)
    assert [r.id for r in records] == ["c", "a"]
    assert records[1].metadata == {"n": 1} and np.allclose(records[1].vector, vectors[0], atol=1e-6)

    hits = client.search("docs", vectors[1:2], base.SearchParams(k=2, with_chunks=True))
    assert hits[0][0].id == "b" and hits[0][0].score == pytest.approx(1.0, abs=1e-5)
    assert hits[0][0].chunks is not None and hits[0][0].start == 0
    lexical = client.search("docs", None, base.SearchParams(k=1, mode="lexical", texts=["pear"]))
    assert [h.id for h in lexical[0]] == ["b"]
    filtered = client.search("docs", vectors[1:2], base.SearchParams(k=3, filter={"n": {"$gte": 3}}))
    assert [h.id for h in filtered[0]] == ["c"]

    assert client.delete("docs", filter={"n": 1}).count == 1
    assert client.delete("docs", ids=["b", "nobody"]).count == 1
    scanned = [r for page in client.scan("docs", batch=1) for r in page]
    assert [(r.id, r.spans) for r in scanned] == [("c", [(0, 6), (7, 25)])]

    with pytest.raises(base.InvalidRequest, match="shape"):  # the index's own validation, across the process
        client.upsert("docs", [base.Document("d", "x")], np.ones((1, 3), np.float32))
    with pytest.raises(base.CollectionNotFound):
        client.info("nothing")
    assert client.clear("docs").total == 0
    assert client.drop_collection("docs").count >= 0
    assert client.list_collections() == []


def test_replace_collection_streams_batches_and_an_abort_leaves_it_whole(served):
    _, client, _ = served
    spec = base.CollectionSpec("docs", 4)
    client.create_collection(spec)
    vectors = unit(np.random.default_rng(1).standard_normal((4, 4)))
    client.upsert("docs", [base.Document("old", "old")], vectors[:1])

    def batches(fail: bool = False):
        yield [base.Document("a", "a"), base.Document("b", "b")], vectors[:2]
        if fail:
            raise RuntimeError("the embedder failed")
        yield [base.Document("c", "c")], vectors[2:3]

    with pytest.raises(RuntimeError, match="embedder"):
        client.replace_collection(spec, batches(fail=True))
    assert [r.id for r in client.get("docs", ["old", "a"])] == ["old"]  # aborted: as it was
    result = client.replace_collection(spec, batches())
    assert result.total == 3
    assert [r.id for r in client.get("docs", ["old", "a", "b", "c"])] == ["a", "b", "c"]


def test_a_replacement_that_failed_answers_its_error_to_the_next_batch(served):
    """A batch the index refuses ends the replacement; the client's next batches get that error, not a wait on a
    queue nothing reads any more, and the collection stays as it was."""
    _, client, _ = served
    spec = base.CollectionSpec("docs", 4)
    client.create_collection(spec)
    client.upsert("docs", [base.Document("old", "old")], np.ones((1, 4), np.float32))
    wrong = ([[base.Document(f"d{i}", "x")], np.ones((1, 3), np.float32)] for i in range(12))
    with pytest.raises(base.InvalidRequest, match="shape"):
        client.replace_collection(spec, wrong)
    assert [r.id for r in client.get("docs", ["old", "d0"])] == ["old"]
    assert client.replace_collection(spec, iter([([base.Document("new", "n")], np.ones((1, 4)))])).total == 1


def _raw(endpoint: str, *frames: bytes) -> m.Reply:
    """Frames sent as they are from a REQ socket of our own, and the answer, whatever it is."""
    socket = zmq.Context.instance().socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 10_000)
    socket.connect(endpoint)
    try:
        socket.send_multipart(list(frames))
        return msgspec.msgpack.decode(socket.recv(), type=m.Reply)
    finally:
        socket.close()


VECTORS = np.ones((1, 4), np.float32)
UPSERT = m.Upsert("docs", [base.Document("x", "x")], m.Array("<f4", (1, 4)))


@pytest.mark.parametrize("frames", [
    [b"\xc1 not msgpack"],
    [msgpack.packb({"method": "close", "args": [], "kwargs": {}})],  # the old shape, naming a method of the index
    [msgpack.packb({"method": "drop_collection", "args": ["docs"], "kwargs": {}})],  # ... even one it allows
    [msgpack.packb([99, "docs"])],  # an operation that is none of ours
    [msgpack.packb([m.Op.DROP_COLLECTION.value, 7])],  # a field of the wrong type
    [msgpack.packb([m.Op.FAILED.value, "x", "y", 500])],  # an answer sent as a request
    [m.encode(UPSERT)[0]],  # its array missing
    [m.encode(UPSERT)[0], VECTORS.tobytes()[:-4]],  # its array short of its shape
    [m.encode(m.Upsert("docs", [base.Document("x", "x")], m.Array("|O", (1, 4))))[0], VECTORS.tobytes()],  # objects
    [m.encode(m.Upsert("docs", [base.Document("x", "x")], m.Array("<f4", (-1, 4))))[0], VECTORS.tobytes()],
    [m.encode(m.DropCollection("docs"))[0], VECTORS.tobytes()],  # an array it does not describe
    [m.encode(m.Feed(1, [], m.Array("<f4", (0, 4))))[0]],
])
def test_a_message_that_is_no_request_is_refused_logged_and_the_server_keeps_serving(served, frames, caplog):
    index, client, endpoint = served
    client.create_collection(base.CollectionSpec("docs", 4))
    client.upsert("docs", [base.Document("kept", "kept")], VECTORS)
    with caplog.at_level(logging.ERROR, logger="sembed.index"):
        reply = _raw(endpoint, *frames)
    assert isinstance(reply, m.Failed), reply
    assert (reply.error, reply.status) == ("InvalidRequest", 422) and "malformed index request" in reply.message
    assert any("malformed index request" in r.getMessage() for r in caplog.records)
    # nothing was dispatched: the collection is as it was, and the same server answers the next call
    assert [c.name for c in index.list_collections()] == ["docs"] and index.info("docs").count == 1
    assert [r.id for r in client.get("docs", ["kept"])] == ["kept"]


def test_a_stream_that_is_not_open_is_refused(served):
    _, client, endpoint = served
    reply = _raw(endpoint, *m.encode(m.End(12345)))
    assert isinstance(reply, m.Failed) and reply.error == "InvalidRequest" and "no replacement 12345" in reply.message
    assert isinstance(_raw(endpoint, *m.encode(m.Next(12345))), m.Page)  # an unknown scan is done: no page
    assert client.list_collections() == []


def test_reembedding_through_the_client_keeps_each_documents_chunks(served):
    """service.index.reembed over the wire: the scan's pages carry each document's spans, the replacement's
    batches a vector per chunk."""
    _, client, _ = served
    client.create_collection(base.CollectionSpec("docs", 4, model=base.ModelStamp("old", "1")))
    vectors = unit(np.random.default_rng(2).standard_normal((3, 4)))
    client.upsert("docs", [base.Document("one", "a b"), base.Document("two", "c d e", {}, [(0, 3), (2, 5)])],
                  vectors)
    embedded: list[str] = []

    def embed(texts: list[str]) -> np.ndarray:
        embedded.extend(texts)
        return unit(np.random.default_rng(len(embedded)).standard_normal((len(texts), 4)))

    assert reembed(client, "docs", base.ModelStamp("new", "2"), 4, embed, batch=1).total == 2
    assert sorted(embedded) == ["a b", "c d", "d e"]  # "two"'s chunks [0, 3) and [2, 5), each embedded again
    assert client.info("docs").model == base.ModelStamp("new", "2")
    spans = {r.id: r.spans for page in client.scan("docs") for r in page}
    assert spans == {"one": None, "two": [(0, 3), (2, 5)]}
