"""LocalIndex: collections in this process, made durable by a write-ahead log and snapshots.

A write is checked in the caller's thread, then handed to one committer thread, which appends
it to the log, fsyncs, applies it in memory and only then answers. Writers that arrive while an
fsync runs are appended together and share the next one (group commit), so concurrent writers
cost one fsync per group, not one each. A write the disk refuses is cut back out of the log and
never applied. Every N writes or T seconds the committer captures the collections (cheap: written
vectors never change) and a snapshot thread writes them (write, fsync, rename, fsync the folder);
start-up loads the newest complete snapshot and replays the log after it.

Quantized collections (vectors.py) log and snapshot their float vectors as any other; a snapshot
also keeps an int8 collection's trained ranges (`<i>.ranges.npy`). With float_vectors="disk" their
floats live in files under `<path>/floats` (a temporary folder for an index in memory), emptied at
start: the log and snapshots rebuild them.

One node, one writer: several replicas must not each hold their own copy (use MilvusIndex).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import struct
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from service.index.base import (
    SEARCH_MODES,
    CollectionExists,
    CollectionInfo,
    CollectionNotFound,
    CollectionSpec,
    Document,
    Hit,
    InvalidRequest,
    ModelStamp,
    NotDurable,
    Record,
    SearchParams,
    SparseRows,
    WriteResult,
    vector_rows,
)
from service.index.collection import Collection
from service.index.filters import parse_filter
from service.index.lexical import REBUILD_AT
from service.index.validation import (
    check_chunks,
    check_collection_name,
    check_id,
    check_metadata,
    check_sparse,
    check_vectors,
)
from service.index.vectors import DEFAULT_OVERSAMPLE, check_oversample, check_quantization, parse_index_type
from service.index.wal import CorruptLog, WriteAheadLog, fsync_dir

log = logging.getLogger("sembed.index")

_LEN = struct.Struct("<I")
MAX_GROUP = 256  # writes per group commit
STAGING = "_staging_"  # a collection being rebuilt under this prefix is invisible until it replaces its target


def _encode(op: dict[str, Any], blob: bytes = b"") -> bytes:
    head = json.dumps(op, separators=(",", ":"), ensure_ascii=False).encode()
    return _LEN.pack(len(head)) + head + blob


def _decode(payload: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = _LEN.unpack_from(payload)
    return json.loads(payload[4: 4 + n]), payload[4 + n:]


def _create_op(spec: CollectionSpec, exist_ok: bool) -> dict[str, Any]:
    op = {"op": "create", "c": spec.name, "dim": spec.dimension, "type": spec.index_type,
          "model": asdict(spec.model) if spec.model else None, "exist_ok": exist_ok, "q": spec.quantization}
    if spec.lexical:  # only then: logs written before lexical indexes replay unchanged
        op["lex"] = True
    if spec.sparse_model is not None:  # likewise: logs from before sparse vectors replay unchanged
        op["sparse"], op["sdim"] = asdict(spec.sparse_model), spec.sparse_dimension
    return op


def _spec(name: str, dimension: int, index_type: str, model: dict | None, quantization: str, lexical: bool,
          sparse_model: dict | None, sparse_dimension: int) -> CollectionSpec:
    """A collection's spec as a log record or a snapshot's manifest holds it."""
    return CollectionSpec(name, dimension, index_type, _stamp(model), quantization, lexical, _stamp(sparse_model),
                          sparse_dimension)


def _sparse_blob(sparse: SparseRows) -> bytes:
    """A write's sparse vectors after its dense ones in its log record: indptr (int64), indices (int32), values."""
    return sparse.indptr.tobytes() + sparse.indices.tobytes() + sparse.values.tobytes()


def _sparse_from(blob: bytes, rows: int, nnz: int) -> SparseRows:
    indptr = np.frombuffer(blob, np.int64, rows + 1)
    indices = np.frombuffer(blob, np.int32, nnz, (rows + 1) * 8)
    values = np.frombuffer(blob, np.float32, nnz, (rows + 1) * 8 + nnz * 4)
    if (rows + 1) * 8 + nnz * 8 != len(blob) or indptr[-1] != nnz:
        raise CorruptLog(f"a write's sparse vectors: {len(blob)} bytes for {rows} rows of {nnz} entries")
    return SparseRows(indptr, indices, values)


def _doc_entry(d: Document) -> list:
    """A document in a log record or a snapshot: [id, text, metadata], and its chunk spans if it has several
    (records and snapshots from before chunking have three fields: one chunk each)."""
    entry: list = [d.id, d.text, d.metadata]
    if d.chunks is not None:
        entry.append([[int(a), int(b)] for a, b in d.chunks])
    return entry


def _stamp(model: dict | None) -> ModelStamp | None:
    return ModelStamp(**model) if model else None


class LocalIndex:
    def __init__(self, path: str | Path | None = None, fsync: bool = True, snapshot_every_ops: int = 10_000,
                 snapshot_every_s: float = 300.0, background: bool = True, gpu: str = "auto",
                 oversample: int = DEFAULT_OVERSAMPLE, float_vectors: Literal["memory", "disk"] = "memory",
                 lexical_rebuild: float = REBUILD_AT):
        self.path = Path(path) if path else None
        if not 0 <= lexical_rebuild <= 1:
            raise ValueError(f"lexical_rebuild is a fraction between 0 and 1, not {lexical_rebuild}")
        # lexical indexes are rebuilt from the live items once deleted ones are over this fraction (lexical.py)
        self.lexical_rebuild = lexical_rebuild
        self.gpu = gpu  # auto: Flat and IVF search on a GPU when FAISS has one (gpu.py); off: never
        check_oversample(oversample)
        self.oversample = oversample  # quantized collections: candidates rescored per hit, unless a search says
        if float_vectors not in ("memory", "disk"):
            raise ValueError(f"float_vectors is memory or disk, not {float_vectors!r}")
        self._float_dir: Path | None = None  # quantized collections' float vectors: in memory, or files here
        self._float_dir_temporary = False
        self.snapshot_every_ops = snapshot_every_ops
        self.snapshot_every_s = snapshot_every_s
        self._background = background
        self._collections: dict[str, Collection] = {}
        self._seq = 0
        self._since_snapshot = 0
        self._last_snapshot = time.monotonic()
        self._queue: queue.Queue = queue.Queue()
        self._snapshot_lock = threading.Lock()  # one snapshot written at a time
        self._snapshot_thread: threading.Thread | None = None
        self._wal = None
        if self.path:
            if not self.path.is_dir():
                self.path.mkdir(parents=True)
                if fsync:
                    fsync_dir(self.path.parent)
            self._wal = WriteAheadLog(self.path / "wal", fsync=fsync)
        if float_vectors == "disk":
            if self.path:
                self._float_dir = self.path / "floats"
                shutil.rmtree(self._float_dir, ignore_errors=True)  # a previous run's: rebuilt below
                self._float_dir.mkdir()
            else:
                self._float_dir, self._float_dir_temporary = Path(tempfile.mkdtemp(prefix="sembed-floats-")), True
        if self._wal:
            self._recover()
            self._wal.open()
        self._committer = threading.Thread(target=self._commit_loop, name="index-committer", daemon=True)
        self._committer.start()

    # the VectorIndex interface ------------------------------------------------------------------

    def create_collection(self, spec: CollectionSpec, exist_ok: bool = False) -> CollectionInfo:
        check_collection_name(spec.name)
        if not 1 <= spec.dimension <= 65536:
            raise InvalidRequest(f"dimension must be between 1 and 65536, not {spec.dimension}")
        check_quantization(spec.quantization, parse_index_type(spec.index_type, spec.dimension))
        self._submit(_create_op(spec, exist_ok))  # an existing one of this dimension with exist_ok: no record
        return self.info(spec.name)

    def drop_collection(self, name: str) -> WriteResult:
        return self._submit({"op": "drop", "c": name})

    def list_collections(self) -> list[CollectionInfo]:
        return [c.info() for n, c in sorted(self._collections.items()) if not n.startswith(STAGING)]

    def info(self, name: str) -> CollectionInfo:
        return self._get(name).info()

    def upsert(self, name: str, documents: list[Document], vectors: np.ndarray,
               sparse: SparseRows | None = None) -> WriteResult:
        collection = self._get(name)
        seen = set()
        for d in documents:
            check_id(d.id)
            check_metadata(d.metadata, f"metadata of {d.id!r}")
            check_chunks(d.id, d.text, d.chunks)
            if d.id in seen:
                raise InvalidRequest(f"document id {d.id!r} appears twice in one write")
            seen.add(d.id)
        vectors = check_vectors(vectors, vector_rows(documents), collection.spec.dimension)
        # one record holds every chunk of every document (and its sparse vector): replay applies a document whole
        # or not at all
        op: dict[str, Any] = {"op": "upsert", "c": name, "docs": [_doc_entry(d) for d in documents]}
        spec = collection.spec
        if (sparse is None) != (spec.sparse_model is None):
            raise InvalidRequest(f"collection {name!r} keeps sparse vectors: a write brings one per chunk"
                                 if sparse is None else f"collection {name!r} keeps no sparse vectors")
        if sparse is None:
            return self._submit(op, vectors.tobytes())
        sparse = check_sparse(sparse, len(vectors), spec.sparse_dimension)
        op["sp"] = len(sparse.indices)
        return self._submit(op, vectors.tobytes() + _sparse_blob(sparse))

    def get(self, name: str, ids: list[str], with_vector: bool = False) -> list[Record]:
        return self._get(name).get(ids, with_vector)

    def delete(self, name: str, ids: list[str] | None = None, filter: dict[str, Any] | None = None) -> WriteResult:
        if (ids is None) == (filter is None):
            raise InvalidRequest("delete takes either ids or a filter")
        self._get(name)
        if filter is not None:
            parse_filter(filter)  # refuse a bad filter before it is queued
        return self._submit({"op": "delete", "c": name, "ids": ids, "filter": filter})

    def clear(self, name: str) -> WriteResult:
        return self._submit({"op": "clear", "c": name})

    def search(self, name: str, queries: np.ndarray | None, params: SearchParams) -> list[list[Hit]]:
        collection = self._get(name)
        if params.k < 1:
            raise InvalidRequest("k must be at least 1")
        check_search_mode(name, collection.spec, params)
        if params.mode not in ("lexical", "sparse"):
            if queries is None:
                raise InvalidRequest(f"mode {params.mode!r} needs query vectors")
            queries = check_vectors(queries, len(queries), collection.spec.dimension)
            if params.texts is not None and len(params.texts) != len(queries):
                raise InvalidRequest(f"{len(params.texts)} query texts for {len(queries)} query vectors")
        return collection.search(queries, params)

    def scan(self, name: str, batch: int = 1000):
        return self._get(name).scan(batch)

    def replace_collection(self, spec: CollectionSpec, batches) -> WriteResult:
        """Fill a hidden staging collection from (documents, vectors) batches, then swap it in with one
        logged rename; writes to the target are refused meanwhile, so none is lost by the swap."""
        target = self._get(spec.name)
        if target.frozen:
            raise CollectionExists(f"collection {spec.name!r} is already being rebuilt")
        staging = replace(spec, name=STAGING + spec.name)
        target.frozen = "it is being re-embedded"
        try:
            if staging.name in self._collections:
                self._submit({"op": "drop", "c": staging.name})
            self._submit(_create_op(staging, exist_ok=False))
            for documents, vectors, *sparse in batches:  # (documents, vectors[, sparse vectors])
                self.upsert(staging.name, documents, vectors, *sparse)
            return self._submit({"op": "rename", "c": staging.name, "to": spec.name})
        finally:
            target.frozen = None

    def close(self) -> None:
        self._queue.put(None)
        self._committer.join(timeout=30)
        if self._snapshot_thread is not None:
            self._snapshot_thread.join(timeout=600)
        if self._wal:
            self._wal.close()
        for c in self._collections.values():
            c.close()
        if self._float_dir_temporary and self._float_dir is not None:
            shutil.rmtree(self._float_dir, ignore_errors=True)

    def snapshot(self) -> int:
        """Take a snapshot now (waits for it); returns its sequence number."""
        return self._submit({"op": "snapshot"}).sequence

    # the committer ------------------------------------------------------------------------------

    def _new_collection(self, spec: CollectionSpec) -> Collection:
        return Collection(spec, background=self._background, gpu=self.gpu, oversample=self.oversample,
                          float_dir=self._float_dir, lexical_rebuild=self.lexical_rebuild)

    def _get(self, name: str) -> Collection:
        collection = self._collections.get(name)
        if collection is None:
            raise CollectionNotFound(f"no collection named {name!r}")
        return collection

    def _submit(self, op: dict[str, Any], blob: bytes = b"") -> WriteResult:
        future: Future = Future()
        self._queue.put((op, blob, future))
        return future.result()

    def _commit_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < MAX_GROUP:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            self._commit(batch)
            try:
                self._maybe_snapshot()
            except Exception as e:  # the committer must live on: the log still holds every write
                log.error("snapshot not started (%s); retrying after another %d writes or %.0f s", e,
                          self.snapshot_every_ops, self.snapshot_every_s)
                self._since_snapshot, self._last_snapshot = 0, time.monotonic()

    def _commit(self, batch) -> None:
        group: list = []
        start = (0, 0)  # the log's position before the group, to cut it back if its fsync fails
        for op, blob, future in batch:
            if op["op"] == "snapshot":
                self._flush(group, start)
                group = []
                try:
                    future.set_result(WriteResult(0, self._start_snapshot(wait=True), 0))
                except Exception as e:
                    future.set_exception(e)
                continue
            try:
                op = self._prepare(op)
                if op is None:  # nothing to log: the answer is known
                    future.set_result(WriteResult(0, self._seq, 0))
                    continue
                if not group and self._wal:
                    start = self._wal.position
                seq = self._wal.append(_encode(op, blob)) if self._wal else self._seq + len(group) + 1
            except Exception as e:
                future.set_exception(e)
                continue
            group.append((seq, op, blob, future))
            if op["op"] != "upsert" and op["op"] != "delete":  # structure changes: later writes see them
                self._flush(group, start)
                group = []
        self._flush(group, start)

    def _prepare(self, op: dict[str, Any]) -> dict[str, Any] | None:
        """Checks against the current state, and resolves a delete filter to ids (replay is then exact)."""
        name, kind = op["c"], op["op"]
        if kind == "create":
            existing = self._collections.get(name)
            if existing is not None:
                if op.get("exist_ok") and existing.spec.dimension == op["dim"]:
                    # a lexical index asked for or no longer (SEMBED_INDEX_LEXICAL): built from the texts, or dropped
                    on = op.get("lex", False)
                    return None if on == existing.spec.lexical else {"op": "lexical", "c": name, "on": on}
                raise CollectionExists(f"collection {name!r} exists (dimension {existing.spec.dimension}, "
                                       f"{existing.spec.index_type})")
            return op
        collection = self._get(name)
        if collection.frozen and kind != "rename" and not name.startswith(STAGING):
            raise CollectionExists(f"collection {name!r} does not take writes now: {collection.frozen}; retry later")
        if kind == "delete" and op.get("filter") is not None:
            return {"op": "delete", "c": name, "ids": collection.ids_matching(op["filter"])}
        return op

    def _flush(self, group, start: tuple[int, int]) -> None:
        if not group:
            return
        if self._wal:
            try:
                self._wal.sync()
            except NotDurable as e:
                self._wal.undo_unsynced(*start)
                for *_, future in group:
                    future.set_exception(e)
                return
        for seq, op, blob, future in group:
            try:
                count = self._apply(seq, op, blob)
                total = len(self._collections[op["to"] if op["op"] == "rename" else op["c"]]) \
                    if op["op"] != "drop" else 0
                future.set_result(WriteResult(count, seq, total))
            except Exception as e:  # a bug, not a bad request: the log holds it, replay will retry it
                log.exception("applying log record %d failed", seq)
                future.set_exception(e)

    def _apply(self, seq: int, op: dict[str, Any], blob: bytes) -> int:
        """Apply one logged write in memory; the same code replays the log at start."""
        self._seq = seq
        self._since_snapshot += 1
        kind, name = op["op"], op["c"]
        if kind == "create":
            spec = _spec(name, op["dim"], op["type"], op["model"], op.get("q", "none"), op.get("lex", False),
                         op.get("sparse"), op.get("sdim", 0))
            self._collections[name] = self._new_collection(spec)
            self._collections[name].sequence = seq
            return 0
        collection = self._collections[name]
        if kind == "drop":
            del self._collections[name]
            collection.close()
            return len(collection)
        collection.sequence = seq
        if kind == "upsert":
            docs = [Document(*entry) for entry in op["docs"]]
            rows = vector_rows(docs)
            dense = rows * collection.spec.dimension * 4
            vectors = np.frombuffer(blob, dtype=np.float32, count=rows * collection.spec.dimension)
            sparse = _sparse_from(blob[dense:], rows, op["sp"]) if "sp" in op else None
            collection.upsert(docs, vectors.reshape(rows, collection.spec.dimension), sparse)
            return len(docs)
        if kind == "delete":
            return collection.delete(op["ids"])
        if kind == "lexical":
            collection.set_lexical(op["on"])
            return 0
        if kind == "clear":
            n = len(collection)
            self._collections[name] = self._new_collection(collection.spec)
            self._collections[name].sequence = seq
            collection.close()
            return n
        if kind == "rename":
            target = op["to"]
            old = self._collections.pop(target, None)
            del self._collections[name]
            collection.spec = replace(collection.spec, name=target)
            self._collections[target] = collection
            if old is not None:
                old.close()
            return len(collection)
        raise CorruptLog(f"unknown log record {kind!r} at sequence {seq}")

    # snapshots and recovery ----------------------------------------------------------------------

    def _maybe_snapshot(self) -> None:
        if not self._wal or not self._since_snapshot:
            return
        if (self._since_snapshot >= self.snapshot_every_ops
                or time.monotonic() - self._last_snapshot >= self.snapshot_every_s):
            self._start_snapshot(wait=False)

    def _start_snapshot(self, wait: bool) -> int:
        """Capture the state at the last applied sequence (committer thread) and write it in the background."""
        if not self._wal:
            return self._seq
        if not self._snapshot_lock.acquire(blocking=wait):
            return self._seq  # one is being written; the next trigger takes another
        try:
            seq = self._seq
            state = [c.capture() for c in self._collections.values()]
            self._wal.rotate()  # raises (and the current segment stays) if the new one cannot be made durable
        except BaseException:
            self._snapshot_lock.release()
            raise
        self._since_snapshot, self._last_snapshot = 0, time.monotonic()

        def write():
            try:
                self._write_snapshot(seq, state)
            finally:
                self._snapshot_lock.release()

        def write_in_background():
            try:
                write()
            except Exception:
                log.exception("snapshot at %d failed; the log still holds every write", seq)

        if wait:
            write()  # a failure reaches the caller of snapshot()
        else:
            self._snapshot_thread = threading.Thread(target=write_in_background, name="index-snapshot", daemon=True)
            self._snapshot_thread.start()
        return seq

    def _persistence(self) -> tuple[Path, WriteAheadLog]:
        """The folder and the log: snapshots and recovery exist only for an index opened with a path."""
        if self.path is None or self._wal is None:
            raise RuntimeError("this index is in memory: it has no folder and no log")
        return self.path, self._wal

    def _write_snapshot(self, seq: int, state) -> None:
        path, wal = self._persistence()
        folder = path / "snapshots"
        if not folder.is_dir():
            folder.mkdir()
            fsync_dir(path)
        final = folder / f"{seq:020d}"
        if final.exists():
            return
        tmp = folder / f"{seq:020d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            self._write_files(tmp, seq, state)
            os.rename(tmp, final)
        except BaseException:  # a failed snapshot leaves no half-written folder to fill the disk
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(folder)
        for old in folder.iterdir():
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
        wal.drop_before(seq)
        log.info("snapshot at sequence %d written (%d collections)", seq, len(state))

    @staticmethod
    def _write_files(tmp: Path, seq: int, state) -> None:
        manifest: dict[str, Any] = {"sequence": seq, "collections": []}
        for i, (spec, vectors, rows, docs, sequence, ranges, sparse) in enumerate(state):
            with open(tmp / f"{i}.npy", "wb") as f:
                np.save(f, vectors[rows])
                f.flush()
                os.fsync(f.fileno())
            with open(tmp / f"{i}.docs.jsonl", "w", encoding="utf-8") as f:
                for d in docs:  # one line per document; its chunks' vectors are consecutive rows of {i}.npy
                    f.write(json.dumps(_doc_entry(d), ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
            if ranges is not None:
                with open(tmp / f"{i}.ranges.npy", "wb") as f:
                    np.save(f, ranges)
                    f.flush()
                    os.fsync(f.fileno())
            if sparse is not None:  # the live rows' sparse vectors, in the order of {i}.npy's
                with open(tmp / f"{i}.sparse.npz", "wb") as f:
                    sp.save_npz(f, sparse(rows), compressed=False)
                    f.flush()
                    os.fsync(f.fileno())
            manifest["collections"].append({"file": i, "name": spec.name, "dimension": spec.dimension,
                                            "index_type": spec.index_type, "sequence": sequence,
                                            "model": asdict(spec.model) if spec.model else None,
                                            "quantization": spec.quantization, "ranges": ranges is not None,
                                            "lexical": spec.lexical,
                                            "sparse_model": asdict(spec.sparse_model) if spec.sparse_model else None,
                                            "sparse_dimension": spec.sparse_dimension})
        with open(tmp / "manifest.json", "w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)

    def _recover(self) -> None:
        path, wal = self._persistence()
        folder = path / "snapshots"
        snapshots = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.endswith(".tmp")
                           and (p / "manifest.json").is_file()) if folder.is_dir() else []
        after = 0
        if snapshots:
            after = self._load_snapshot(snapshots[-1])
        expected = after + 1
        for seq, payload in wal.replay(after):
            if seq != expected:
                raise CorruptLog(f"the log jumps from sequence {expected - 1} to {seq}: records are missing")
            op, blob = _decode(payload)
            self._apply(seq, op, blob)
            expected = seq + 1
        self._seq = max(self._seq, after)
        self._since_snapshot = 0
        log.info("index at %s recovered: %d collections, sequence %d", self.path, len(self._collections), self._seq)

    def _load_snapshot(self, folder: Path) -> int:
        manifest = json.loads((folder / "manifest.json").read_text())
        for entry in manifest["collections"]:
            spec = _spec(entry["name"], entry["dimension"], entry["index_type"], entry["model"],
                         entry.get("quantization", "none"), entry.get("lexical", False), entry.get("sparse_model"),
                         entry.get("sparse_dimension", 0))
            collection = self._new_collection(spec)
            if entry.get("ranges"):  # trained before this snapshot: the same ranges, not retrained from it
                collection.vectors.set_ranges(np.load(folder / f"{entry['file']}.ranges.npy", allow_pickle=False))
            vectors = np.load(folder / f"{entry['file']}.npy", allow_pickle=False)
            with open(folder / f"{entry['file']}.docs.jsonl", encoding="utf-8") as f:
                docs = [Document(*json.loads(line)) for line in f]
            if vector_rows(docs) != len(vectors):
                raise CorruptLog(f"snapshot {folder}: {len(docs)} documents with {vector_rows(docs)} chunks for "
                                 f"{len(vectors)} vectors")
            sparse = None
            if spec.sparse_model is not None:
                matrix = sp.csr_array(sp.load_npz(folder / f"{entry['file']}.sparse.npz"))
                if matrix.shape != (len(vectors), spec.sparse_dimension):
                    raise CorruptLog(f"snapshot {folder}: sparse vectors of shape {matrix.shape} for {len(vectors)} "
                                     f"vectors of a {spec.sparse_dimension}-dimension sparse model")
                matrix.sort_indices()
                sparse = SparseRows(matrix.indptr.astype(np.int64), matrix.indices.astype(np.int32),
                                    matrix.data.astype(np.float32))
            if docs:
                collection.upsert(docs, vectors, sparse)
            collection.sequence = entry.get("sequence", manifest["sequence"])
            self._collections[spec.name] = collection
        self._seq = manifest["sequence"]
        return manifest["sequence"]



def check_search_mode(name: str, spec: CollectionSpec, params: SearchParams) -> None:
    """The search's mode and fusion options, against what collection `name` holds (a lexical index, sparse
    vectors, or neither)."""
    if params.mode not in SEARCH_MODES:
        raise InvalidRequest(f"unknown search mode {params.mode!r}: use one of {', '.join(SEARCH_MODES)}")
    if params.mode == "dense":
        return
    lexical, sparse = spec.lexical, spec.sparse_model is not None
    if params.mode == "lexical" and not lexical or params.mode == "hybrid" and not (lexical or sparse):
        lacks = "no lexical index" if params.mode == "lexical" else "no lexical index and no sparse vectors"
        raise InvalidRequest(f"collection {name!r} has {lacks}, "
                             f"so mode {params.mode!r} cannot search it: create the collection with \"lexical\": "
                             "true (or a \"sparse_model\"), or search with mode 'dense'")
    if params.mode == "sparse" and not sparse:
        raise InvalidRequest(f"collection {name!r} has no sparse vectors, so mode 'sparse' cannot search it: create "
                             "the collection with \"sparse_model\": <a served sparse model>, or search with mode "
                             "'dense'" + (" or 'lexical'" if lexical else ""))
    if lexical and params.mode in ("lexical", "hybrid") and params.texts is None:
        raise InvalidRequest(f"mode {params.mode!r} searches by text: give the query as text")
    if sparse and params.mode in ("sparse", "hybrid") and params.sparse_queries is None:
        raise InvalidRequest(f"mode {params.mode!r} searches by the query's sparse vector: give the query as text")
    if params.rrf_k < 1 or (params.candidates is not None and params.candidates < 1):
        raise InvalidRequest("fusion: k and candidates must be at least 1")
    weights = {"dense_weight": params.dense_weight, "lexical_weight": params.lexical_weight,
               "sparse_weight": params.sparse_weight}
    if not all(np.isfinite(w) and w >= 0 for w in weights.values()):
        raise InvalidRequest("fusion: dense_weight, lexical_weight and sparse_weight must be finite and >= 0")
    if params.mode == "hybrid":
        used = ["dense_weight"] + ["lexical_weight"] * lexical + ["sparse_weight"] * sparse
        if not any(weights[w] for w in used):
            raise InvalidRequest(f"fusion: {' and '.join(used)} cannot all be 0 (the rankings collection {name!r} "
                                 "fuses)")
