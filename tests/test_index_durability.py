"""Durability of LocalIndex (issue 10): a write is in the log and fsynced before its reply, or it
fails and leaves nothing behind.

Each test makes one point of a write fail or "crash" there, then reopens the folder and compares
the whole state (collections, documents, vectors, sequences) with what was acknowledged:
a torn last record at every byte; damage before the tail (refused); a failed fsync; a full or
read-only disk; a snapshot torn before its rename, or cut off after it; snapshots taken while
writers write; group commit; the 503/507 answers over HTTP; and a kill -9 loop against the real
server while several clients write, after which every acknowledged document must be found.
"""

from __future__ import annotations

import concurrent.futures
import errno
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.index import CollectionSpec, Document, LocalIndex, ModelStamp, NotDurable
from service.index.wal import HEADER, MAGIC, CorruptLog, WriteAheadLog, _records
from tests.conftest import free_port, wait_ready, wait_until

REPO = Path(__file__).resolve().parent.parent
DIM = 4
C = "docs"


class Crash(Exception):
    """Where a test stops a step, as if the process had died there."""


def make(path: Path, **options) -> LocalIndex:
    options.setdefault("snapshot_every_ops", 10**9)
    options.setdefault("snapshot_every_s", 1e9)
    return LocalIndex(path, background=False, **options)


def vector(doc_id: str, version: str = "") -> np.ndarray:
    v = np.random.default_rng(zlib.crc32(f"{doc_id}/{version}".encode())).normal(size=DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


def put(index: LocalIndex, *ids: str, version: str = "", collection: str = C):
    docs = [Document(i, f"text {i} {version}", {"id": i, "v": version}) for i in ids]
    return index.upsert(collection, docs, np.stack([vector(i, version) for i in ids]))


def state(index: LocalIndex) -> dict:
    """Everything a client can read back: each collection's spec, count, sequence and documents."""
    out = {}
    for info in index.list_collections():
        ids = [r.id for batch in index.scan(info.name) for r in batch]
        records = index.get(info.name, ids, with_vector=True)
        out[info.name] = (info.dimension, info.index_type, info.model, info.count, info.sequence,
                          {r.id: (r.text, r.metadata, tuple(r.vector)) for r in records})
    return out


def reopened(path: Path, **options) -> dict:
    index = make(path, **options)
    try:
        return state(index)
    finally:
        index.close()


def segments(path: Path) -> list[Path]:
    return sorted((path / "wal").glob("*.wal"))


def snapshot_dirs(path: Path) -> list[str]:
    folder = path / "snapshots"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def within(seconds: float, fn, *args):
    """fn(*args), failing the test (not hanging it) if the index stops answering."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn(*args)
        except BaseException as e:  # handed to the test's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"no answer within {seconds} s: the index stopped taking writes")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def seeded(path: Path) -> LocalIndex:
    index = make(path)
    index.create_collection(CollectionSpec(C, DIM, "Flat", ModelStamp("m", "ab" * 32)))
    put(index, "a", "b")
    put(index, "c")
    return index


# --- the log's tail --------------------------------------------------------------------------------

GARBAGE = [b"\x00" * 64, bytes(random.Random(1).randrange(256) for _ in range(37)),
           HEADER.pack(MAGIC, 12, 9, 0) + b"not a record",  # a whole record with a wrong checksum
           HEADER.pack(MAGIC, 1 << 20, 9, 0) + b"short"]  # a header promising more than is there


def test_a_torn_last_record_is_cut_off_at_every_byte(tmp_path, monkeypatch):
    base = tmp_path / "index"
    index = seeded(base)
    index.delete(C, ids=["b"])
    before = state(index)
    put(index, "last", "a", version="2")  # the record that tears: a new document and a replacement
    after = state(index)
    index.close()
    segment = segments(base)[-1]
    data = segment.read_bytes()
    ends = [end for _, end, _ in _records(data)]
    start, end = ends[-2], ends[-1]
    assert end == len(data)

    monkeypatch.setattr("service.index.wal.os.fsync", lambda fd: None)  # hundreds of reopens: parsing is tested here
    for cut in range(start, end + 1):
        tails = [b"", GARBAGE[cut % len(GARBAGE)]] if cut < end else GARBAGE
        for tail in tails:
            segment.write_bytes(data[:cut] + tail)
            assert reopened(base) == (after if cut == end else before), (cut, tail)
            assert segment.stat().st_size == (end if cut == end else start), "the torn bytes are cut off"

    # after a cut, the log goes on where the last whole record ended, and that survives a reopen
    for cut in (start + 1, start + HEADER.size, end - 1):
        segment.write_bytes(data[:cut] + GARBAGE[0])
        index = make(base)
        assert put(index, "next").sequence == before[C][4] + 1
        expected = state(index)
        index.close()
        assert reopened(base) == expected and "next" in expected[C][5]


def _two_segments(path: Path) -> LocalIndex:
    """A log of two segments (a snapshot that never got to drop the first), then more writes."""
    index = seeded(path)
    index.close()
    log = WriteAheadLog(path / "wal")
    list(log.replay(0))
    log.open()
    log.rotate()
    log.close()
    index = make(path)
    put(index, "d", "e")
    put(index, "f")
    return index


def test_an_intact_log_of_several_segments_replays_whole(tmp_path):
    index = _two_segments(tmp_path)
    expected = state(index)
    index.close()
    assert len(segments(tmp_path)) == 2
    assert reopened(tmp_path) == expected


@pytest.mark.parametrize("damage", ["flipped byte", "cut short", "garbage after", "missing segment",
                                    "missing segment before an empty one"])
def test_damage_before_the_tail_of_the_last_segment_is_refused(tmp_path, damage):
    """Acknowledged records are never dropped silently: a crash can only tear the very end of the log."""
    index = _two_segments(tmp_path)
    index.close()
    if damage == "missing segment before an empty one":  # a third segment, empty (a rotation, then a crash)
        log = WriteAheadLog(tmp_path / "wal")
        list(log.replay(0))
        log.open()
        log.rotate()
        log.close()
    first, second = segments(tmp_path)[:2]
    data = bytearray(first.read_bytes())
    if damage == "flipped byte":
        data[len(data) - 3] ^= 0x40
        first.write_bytes(bytes(data))
    elif damage == "cut short":
        first.write_bytes(bytes(data[:-1]))
    elif damage == "garbage after":
        first.write_bytes(bytes(data) + GARBAGE[1])
    elif damage == "missing segment":
        first.unlink()
    else:
        second.unlink()
    with pytest.raises(CorruptLog):
        make(tmp_path)


def test_an_empty_segment_left_by_an_undone_rotation_is_removed(tmp_path):
    """A rotation whose folder sync failed unlinks its new segment; after a crash the unlink may not
    have lasted. Such an empty segment, named below the next sequence number, must not take records."""
    index = seeded(tmp_path)
    index.close()
    (tmp_path / "wal" / f"{2:020d}.wal").touch()
    index = make(tmp_path)
    put(index, "d")
    expected = state(index)
    index.close()
    assert [p.name for p in segments(tmp_path)] == [f"{1:020d}.wal"]
    assert reopened(tmp_path) == expected


# --- a write the disk refuses ------------------------------------------------------------------------

def test_a_failed_fsync_fails_the_write_applies_nothing_and_stops_writes(tmp_path, monkeypatch):
    index = seeded(tmp_path)
    before = state(index)
    size = segments(tmp_path)[-1].stat().st_size
    real_fsync = os.fsync

    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("service.index.wal.os.fsync", failing)
    with pytest.raises(NotDurable) as refused:
        put(index, "new", "a", version="2")
    assert refused.value.status == 503
    assert state(index) == before and index.get(C, ["new"]) == []
    assert segments(tmp_path)[-1].stat().st_size == size, "the unsynced record is cut back out"

    # page cache state is unknown after a failed fsync: no write is taken until a restart
    monkeypatch.setattr("service.index.wal.os.fsync", real_fsync)
    for write in (lambda: put(index, "later"), lambda: index.delete(C, ids=["a"]), lambda: index.clear(C),
                  lambda: index.create_collection(CollectionSpec("more", DIM))):
        with pytest.raises(NotDurable) as refused:
            write()
        assert refused.value.status == 503 and "restart" in str(refused.value)
    assert state(index) == before
    index.close()

    index = make(tmp_path)
    assert state(index) == before
    put(index, "new")
    expected = state(index)
    index.close()
    assert reopened(tmp_path) == expected


def test_every_writer_of_a_group_whose_fsync_fails_gets_503(tmp_path, monkeypatch):
    index = seeded(tmp_path)
    before = state(index)
    entered, release = threading.Event(), threading.Event()

    def slow_failing(fd):
        entered.set()
        release.wait(30)  # held until the others have queued up: they form the next group
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("service.index.wal.os.fsync", slow_failing)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(put, index, "g0")]
        assert entered.wait(10)  # the committer is in g0's fsync
        futures += [pool.submit(put, index, f"g{i}") for i in range(1, 6)]
        wait_until(lambda: index._queue.qsize() == 5, 10, what="the other 5 writes queued behind the fsync")
        release.set()
        errors = [f.exception(timeout=30) for f in futures]
    assert all(isinstance(e, NotDurable) and e.status == 503 for e in errors), errors
    assert state(index) == before
    index.close()
    assert reopened(tmp_path) == before


@pytest.mark.parametrize("code, partial, status", [
    (errno.ENOSPC, False, 507), (errno.ENOSPC, True, 507), (errno.EDQUOT, True, 507),
    (errno.EROFS, False, 503), (errno.EROFS, True, 503)])
def test_a_full_or_read_only_disk_refuses_the_write_and_cuts_it_back(tmp_path, monkeypatch, code, partial, status):
    index = seeded(tmp_path)
    before = state(index)
    size = segments(tmp_path)[-1].stat().st_size
    real_write = os.write
    calls = []

    def write(fd, data):
        if fd != index._wal._fd or not armed.is_set():
            return real_write(fd, data)
        calls.append(len(data))
        if partial and len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))  # part of the record lands, then the disk fills
        raise OSError(code, os.strerror(code))

    armed = threading.Event()
    armed.set()
    monkeypatch.setattr("service.index.wal.os.write", write)
    with pytest.raises(NotDurable) as refused:
        put(index, "new", "a", version="2")
    assert refused.value.status == status
    assert len(calls) == (2 if partial else 1)
    assert state(index) == before and index.get(C, ["new"]) == []
    assert segments(tmp_path)[-1].stat().st_size == size, "no byte of the refused record stays"

    armed.clear()  # space is freed: the next write goes through, at the next sequence number
    assert put(index, "new").sequence == before[C][4] + 1
    index.delete(C, ids=["b"])
    expected = state(index)
    index.close()
    assert reopened(tmp_path) == expected


def test_a_full_disk_in_the_middle_of_a_group_fails_only_that_write(tmp_path, monkeypatch):
    index = seeded(tmp_path)
    real_write, real_fsync = os.write, os.fsync
    first, release = threading.Event(), threading.Event()

    def write(fd, data):
        if fd == index._wal._fd and b'"bad"' in bytes(data):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    def fsync(fd):
        first.set()
        release.wait(30)  # held until the next six writes have queued
        real_fsync(fd)

    monkeypatch.setattr("service.index.wal.os.write", write)
    monkeypatch.setattr("service.index.wal.os.fsync", fsync)
    with concurrent.futures.ThreadPoolExecutor(7) as pool:
        blocker = pool.submit(put, index, "first")
        assert first.wait(10)  # the committer is in an fsync: the next six writes queue and go as one group
        futures = {name: pool.submit(put, index, name) for name in ["p", "q", "bad", "r", "s", "t"]}
        wait_until(lambda: index._queue.qsize() == 6, 10, what="the six writes queued behind the fsync")
        release.set()
        blocker.result(timeout=30)
        outcome = {name: f.exception(timeout=30) for name, f in futures.items()}
    assert isinstance(outcome.pop("bad"), NotDurable)
    assert outcome == dict.fromkeys(outcome)  # the others were acknowledged
    expected = state(index)
    assert set(expected[C][5]) == {"a", "b", "c", "first", "p", "q", "r", "s", "t"}
    index.close()
    assert reopened(tmp_path) == expected


# --- snapshots -----------------------------------------------------------------------------------------

def test_a_snapshot_keeps_each_collections_last_sequence(tmp_path):
    index = seeded(tmp_path)
    index.create_collection(CollectionSpec("other", DIM))
    put(index, "x", collection="other")
    index.snapshot()
    expected = state(index)
    assert expected[C][4] < expected["other"][4]
    index.close()
    assert reopened(tmp_path) == expected


def test_a_snapshot_torn_before_its_rename_is_ignored(tmp_path):
    index = seeded(tmp_path)
    index.snapshot()
    put(index, "d")
    index.delete(C, ids=["a"])
    put(index, "b", version="2")
    expected = state(index)
    seq = expected[C][4]
    first = snapshot_dirs(tmp_path)[0]
    index.close()

    # what a crash while writing the next snapshot leaves: its folder, never renamed, files half
    # written (or even all written, manifest included: only the rename makes a snapshot count)
    tmp = tmp_path / "snapshots" / f"{seq:020d}.tmp"
    tmp.mkdir()
    (tmp / "0.npy").write_bytes(b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'")
    (tmp / "manifest.json").write_text(f'{{"sequence": {seq}, "collections": [{{"fi')
    assert reopened(tmp_path) == expected
    shutil.rmtree(tmp)
    shutil.copytree(tmp_path / "snapshots" / first, tmp)
    manifest = (tmp / "manifest.json").read_text()
    (tmp / "manifest.json").write_text(manifest.replace(f'"sequence": {int(first)}', f'"sequence": {seq}'))
    assert reopened(tmp_path) == expected

    index = make(tmp_path)
    put(index, "e")
    index.snapshot()
    expected = state(index)
    index.close()
    assert snapshot_dirs(tmp_path) == [f"{expected[C][4]:020d}"], "the next snapshot clears the torn one"
    assert reopened(tmp_path) == expected


def test_a_snapshot_cut_off_after_its_rename_loses_nothing(tmp_path, monkeypatch):
    """The crash comes after the rename, before the older snapshot and log segments are deleted."""
    index = seeded(tmp_path)
    index.snapshot()
    put(index, "d")
    real_rmtree = shutil.rmtree

    def crash_on_old(path, *args, **kwargs):
        if not str(path).endswith(".tmp"):
            raise Crash(path)
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr("service.index.local.shutil.rmtree", crash_on_old)
    with pytest.raises(Crash):
        index.snapshot()
    monkeypatch.setattr("service.index.local.shutil.rmtree", real_rmtree)
    assert len(snapshot_dirs(tmp_path)) == 2 and len(segments(tmp_path)) == 2
    put(index, "e")
    index.delete(C, ids=["a"])
    expected = state(index)
    index.close()
    assert reopened(tmp_path) == expected

    index = make(tmp_path)
    put(index, "f")
    index.snapshot()
    expected = state(index)
    index.close()
    assert len(snapshot_dirs(tmp_path)) == 1 and len(segments(tmp_path)) == 1
    assert reopened(tmp_path) == expected


def test_a_snapshot_that_fails_loses_nothing_and_leaves_no_debris(tmp_path, monkeypatch):
    index = seeded(tmp_path)

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("service.index.local.np.save", disk_full)
    with pytest.raises(OSError):
        index.snapshot()
    monkeypatch.undo()
    assert snapshot_dirs(tmp_path) == [], "the half-written snapshot is removed"
    put(index, "d")
    expected = state(index)
    index.close()
    assert reopened(tmp_path) == expected


@pytest.mark.parametrize("failure", ["segment cannot be created", "folder cannot be synced"])
def test_a_snapshot_that_cannot_start_a_segment_keeps_the_index_writable(tmp_path, monkeypatch, failure):
    index = seeded(tmp_path)
    index.close()
    index = make(tmp_path, snapshot_every_ops=2)
    real_open, real_fsync = os.open, os.fsync

    def open_(path, flags, *args, **kwargs):
        if str(path).endswith(".wal") and not os.path.exists(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *args, **kwargs)

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "Input/output error")
        return real_fsync(fd)

    if failure == "segment cannot be created":
        monkeypatch.setattr("service.index.wal.os.open", open_)
    else:
        monkeypatch.setattr("service.index.wal.os.fsync", fsync)
    for i in range(6):  # snapshots are asked for, and cannot rotate the log
        within(20, put, index, f"n{i}")
    with pytest.raises(NotDurable):  # one asked for explicitly says so (and comes after any the writes asked for)
        within(20, index.snapshot)
    assert snapshot_dirs(tmp_path) == [] and len(segments(tmp_path)) == 1
    monkeypatch.undo()
    within(20, put, index, "n6")
    within(20, put, index, "n7")  # a snapshot now succeeds
    expected = state(index)
    assert len(expected[C][5]) == 11
    index.close()
    assert len(snapshot_dirs(tmp_path)) == 1
    assert reopened(tmp_path) == expected


def test_background_snapshots_while_writers_write(tmp_path, monkeypatch):
    index = make(tmp_path, snapshot_every_ops=15)
    index.create_collection(CollectionSpec(C, DIM))
    index.create_collection(CollectionSpec("other", DIM, "HNSW8"))
    written, acked, writers_done = [], [], threading.Event()
    real_write_snapshot = LocalIndex._write_snapshot

    def slow_write_snapshot(self, seq, captured):
        written.append(seq)
        # writers go on while the snapshot is written: it ends only after 20 more acknowledged writes (or
        # the last one), so however fast this disk is, the stream spans several snapshots
        start = len(acked)
        wait_until(lambda: len(acked) >= start + 20 or writers_done.is_set(), 30,
                   what="20 writes acknowledged while a snapshot is written", interval=0.001)
        return real_write_snapshot(self, seq, captured)

    monkeypatch.setattr(LocalIndex, "_write_snapshot", slow_write_snapshot)
    models = [{} for _ in range(4)]

    def writer(t: int) -> None:
        rng, model, n = random.Random(t), models[t], 0
        for step in range(40):
            choice = rng.random()
            if choice < 0.6 or not model:
                ids = [f"w{t}-{n + j}" for j in range(rng.randint(1, 3))]
                n += len(ids)
                put(index, *ids, version=str(step))
                model.update({i: str(step) for i in ids})
            elif choice < 0.8:
                i = rng.choice(sorted(model))
                put(index, i, version=str(step))
                model[i] = str(step)
            else:
                i = rng.choice(sorted(model))
                assert index.delete(C, ids=[i]).count == 1
                del model[i]
            if t == 0 and step % 10 == 5:
                put(index, f"o{step}", collection="other")
                if step == 15:
                    index.clear("other")
            acked.append(step)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(writer, t) for t in range(4)]:
            f.result(timeout=120)
    writers_done.set()
    expected = state(index)
    want = {i: f"text {i} {v}" for m in models for i, v in m.items()}
    assert {i: doc[0] for i, doc in expected[C][5].items()} == want
    assert set(expected["other"][5]) == {"o25", "o35"}
    index.close()
    assert len(written) >= 3, "snapshots were taken while writers wrote"
    assert len(snapshot_dirs(tmp_path)) == 1 and len(segments(tmp_path)) <= 2
    assert reopened(tmp_path) == expected


# --- group commit -------------------------------------------------------------------------------------

def test_concurrent_writers_share_fsyncs(tmp_path, monkeypatch):
    index = make(tmp_path)
    index.create_collection(CollectionSpec(C, DIM))
    real_fsync = os.fsync
    fsyncs = []

    def counting(fd):
        fsyncs.append(fd)
        # a disk's cache flush takes time, and writers queue meanwhile: a simulated latency, not a barrier (no
        # event stands for "the disk is slow"; a loaded machine only makes the groups larger)
        time.sleep(0.005)
        real_fsync(fd)

    monkeypatch.setattr("service.index.wal.os.fsync", counting)
    threads, writes = 8, 50
    barrier = threading.Barrier(threads)

    def writer(t: int) -> list[int]:
        barrier.wait()
        return [put(index, f"t{t}-{i}").sequence for i in range(writes)]

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        sequences = [s for f in [pool.submit(writer, t) for t in range(threads)] for s in f.result(timeout=120)]
    total = threads * writes
    assert sorted(sequences) == list(range(2, total + 2)), "every write acknowledged once, in one sequence"
    assert len(fsyncs) <= total / 3, f"{len(fsyncs)} fsyncs for {total} writes"
    print(f"group commit: {len(fsyncs)} fsyncs for {total} writes")
    expected = state(index)
    assert expected[C][3] == total
    index.close()
    assert reopened(tmp_path) == expected


# --- over HTTP ----------------------------------------------------------------------------------------

@pytest.fixture
def server(tmp_path):
    from service.api.registry import ModelRegistry
    from service.engine.backends.fake import FakeBackend
    from service.engine.core import Engine, EngineConfig
    from service.settings import Settings
    from tests.conftest import LiveServer

    registry = ModelRegistry()
    registry.add_in_process("fake", Engine(FakeBackend(name="fake"), EngineConfig.from_settings()))
    settings = Settings(backend="fake", index_path=tmp_path / "index", access_log=False)
    with LiveServer(settings, registry) as live:
        yield live


def test_http_answers_507_for_a_full_disk_and_503_once_fsync_fails(server, monkeypatch):
    index = server.app.state.index
    real_write = os.write

    def full(fd, data):
        if fd == index._wal._fd:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")

    def add(c, doc_id):
        return c.post("/index/documents", json={"documents": [{"id": doc_id, "text": f"words of {doc_id}"}]})

    def found(c, *ids):
        reply = c.post("/collections/default/documents/get", json={"ids": list(ids)})
        return [d["id"] for d in reply.json()["documents"]]

    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert add(c, "a").status_code == 200
        monkeypatch.setattr("service.index.wal.os.write", full)
        reply = add(c, "b")
        assert reply.status_code == 507 and reply.headers["content-type"] == "application/json"
        assert reply.json()["error_type"] == "NotDurable" and "full" in reply.json()["error"]
        monkeypatch.undo()
        assert add(c, "c").status_code == 200
        assert found(c, "a", "b", "c") == ["a", "c"]

        monkeypatch.setattr("service.index.wal.os.fsync", failing)
        reply = add(c, "d")
        assert reply.status_code == 503 and reply.headers["content-type"] == "application/json"
        assert reply.json()["error_type"] == "NotDurable" and reply.headers["retry-after"]
        monkeypatch.undo()
        for reply in (add(c, "e"), c.delete("/index/documents/a"), c.delete("/index", params={"confirm": "true"}),
                      c.post("/collections", json={"name": "more", "vectors_only": True, "dimension": 4})):
            assert reply.status_code == 503 and reply.json()["error_type"] == "NotDurable", reply.text
        assert found(c, "a", "b", "c", "d", "e") == ["a", "c"]


# --- kill -9 ------------------------------------------------------------------------------------------

# The server's imports take seconds on a busy machine, so a fork server pays them once: each
# start forks a child that runs the real entry point (service.__main__.main) on the same folder.
ZYGOTE = r"""
import os, signal, sys
import service.__main__ as entry
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed children are reaped at once
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        os.setsid()  # the supervisor and its processes: one group, killed together
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(2, 1)  # stdout is the pid channel: the server logs to the log file
        try:
            entry.main()
        finally:
            os._exit(0)
    print(pid, flush=True)
"""


def text_of(doc_id: str) -> str:
    """Every fourth document is long: over the fake model's window of 30 words, so several chunks (issue 41)."""
    if int(doc_id.rsplit("-", 1)[1]) % 4:
        return f"text of {doc_id}"
    return " ".join(f"{doc_id} says part {i} of its long text." for i in range(12))


def test_kill_9_during_concurrent_writes_loses_no_acknowledged_document(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    env = {**os.environ, "SEMBED_BACKEND": "fake", "SEMBED_MODEL_DIR": str(tmp_path / "fake"),
           "SEMBED_INDEX_PATH": str(tmp_path / "index"), "SEMBED_HOST": "127.0.0.1", "SEMBED_PORT": str(port),
           "SEMBED_ACCESS_LOG": "false", "SEMBED_INDEX_SNAPSHOT_EVERY_OPS": "40",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    rng = random.Random(0)
    kills = 12
    stop = threading.Event()
    acked: list[dict[str, str]] = [{} for _ in range(4)]  # id → text, acknowledged and not deleted since
    deleted: list[set[str]] = [set() for _ in range(4)]  # acknowledged deletes
    counts = {"refused": 0, "lost replies": 0}
    replies: list[int] = []  # one per acknowledged write or delete: the kills land among them
    failures: list[str] = []

    def writer(t: int) -> None:
        wrng, n = random.Random(t), 0
        with httpx.Client(base_url=url, timeout=10) as client:
            while not stop.is_set():
                try:
                    if acked[t] and wrng.random() < 0.15:
                        doc_id = wrng.choice(sorted(acked[t]))
                        text = acked[t].pop(doc_id)  # unknown until the reply says
                        reply = client.delete(f"/index/documents/{doc_id}")
                        if reply.status_code == 200:
                            deleted[t].add(doc_id)
                            replies.append(t)
                        elif reply.status_code == 404:  # cannot be: it was acknowledged
                            failures.append(f"acknowledged {doc_id} not found by its delete")
                        else:
                            acked[t][doc_id] = text
                        continue
                    docs = [{"id": f"w{t}-{n + j}", "text": text_of(f"w{t}-{n + j}"), "metadata": {"t": t}}
                            for j in range(wrng.randint(1, 5))]
                    n += len(docs)
                    reply = client.post("/index/documents", json={"documents": docs})
                except httpx.HTTPError:  # killed mid-request: the write may or may not have happened
                    counts["lost replies"] += 1
                    wait_until(lambda: stop.is_set() or answering(), 120, what="the service back after a kill")
                    continue
                if reply.is_success:
                    acked[t].update((d["id"], d["text"]) for d in docs)
                    replies.append(t)
                else:
                    counts["refused"] += 1

    zygote = subprocess.Popen([sys.executable, "-c", ZYGOTE], cwd=REPO, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=open(log, "ab"), text=True)
    children: list[int] = []

    starts: list[float] = []

    def start() -> int:
        began = time.monotonic()
        zygote.stdin.write("start\n")
        zygote.stdin.flush()
        pid = int(zygote.stdout.readline())
        children.append(pid)
        wait_ready(url, log=log)
        starts.append(time.monotonic() - began)
        return pid

    def answering() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def gone(pid: int) -> bool:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        return False

    def kill(pid: int) -> None:
        os.killpg(pid, signal.SIGKILL)  # every process of the service at once, the index writer among them
        wait_until(lambda: gone(pid), 30, what=f"process group {pid} to be gone", interval=0.01)
        children.remove(pid)  # gone: its number may be given to another process

    writers = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(4)]
    started = time.monotonic()
    try:
        pid = start()
        for w in writers:
            w.start()
        for _ in range(kills):
            # a kill after a random number of acknowledged writes: it lands amid the writers' stream
            target = len(replies) + rng.randint(5, 60)
            wait_until(lambda target=target: len(replies) >= target, 60, what=f"{target} writes acknowledged")
            kill(pid)
            pid = start()
        stop.set()
        for w in writers:
            w.join(timeout=30)
        kill(pid)

        # a last start, from scratch (`python -m service`), then every acknowledged document by id
        began = time.monotonic()
        final = subprocess.Popen([sys.executable, "-m", "service"], cwd=REPO, env=env, stdout=open(log, "ab"),
                                 stderr=subprocess.STDOUT)
        try:
            wait_ready(url, log=log)
            starts.append(time.monotonic() - began)
            assert not failures, failures[:10]
            want = {i: text for a in acked for i, text in a.items()}
            gone = set().union(*deleted)
            assert len(want) > 100, f"too few writes went through: {len(want)} ({counts})"
            ids = sorted(want) + sorted(gone)
            found = {}
            with httpx.Client(base_url=url, timeout=30) as client:
                for i in range(0, len(ids), 200):
                    reply = client.post("/collections/default/documents/get", json={"ids": ids[i: i + 200]})
                    assert reply.status_code == 200, reply.text
                    found.update((d["id"], d["text"]) for d in reply.json()["documents"])
            lost = sorted(set(want) - set(found))
            assert not lost, f"{len(lost)} acknowledged documents lost after {kills} kills: {lost[:10]}"
            assert {i: found[i] for i in want} == want
            assert not gone & set(found), f"acknowledged deletes undone: {sorted(gone & set(found))[:10]}"
            # a long document is back with every chunk: the last one (past the window) finds it at its span
            with httpx.Client(base_url=url, timeout=30) as client:
                long_ids = [i for i in sorted(want) if len(want[i].split()) > 30][:25]
                assert len(long_ids) >= 10, f"too few long documents written: {len(long_ids)}"
                for doc_id in long_ids:
                    chunks = client.post("/embed", json={"inputs": want[doc_id], "chunking": True}).json()[0]
                    assert len(chunks) > 1
                    tail = want[doc_id][chunks[-1]["start"]: chunks[-1]["end"]]
                    hit = client.post("/search", json={"query": tail, "k": 1}).json()["results"][0][0]
                    assert (hit["id"], hit["start"], hit["end"]) == (doc_id, chunks[-1]["start"], chunks[-1]["end"])
        finally:
            final.send_signal(signal.SIGKILL)
            final.wait(timeout=30)
    finally:
        stop.set()
        zygote.stdin.close()
        for child in children:
            try:
                os.killpg(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        zygote.wait(timeout=30)
    elapsed = time.monotonic() - started
    print(f"kill -9 loop: {kills} kills, {len(want)} acknowledged documents, {len(gone)} deletes, {counts}, "
          f"{elapsed:.1f} s; starts took {', '.join(f'{t:.1f}' for t in starts)} s")
