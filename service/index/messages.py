"""What crosses between the API processes and the index process (service/index/remote.py), as typed messages.

One request per VectorIndex call the API processes make, one answer shape per kind of result, and `Failed`
for an error (its VectorIndexError class by name). Each is a msgspec struct encoded as an array tagged by its
`Op` (as the engine's headers, service/ipc/messages.py), carrying the index's own dataclasses (CollectionSpec,
Document, SearchParams, Hit...) as fields: a decoder accepts exactly these shapes, so a frame that is none of
them, or has a field of the wrong type, is a `msgspec.ValidationError`, never a method picked by a string off
the wire.

Arrays (the vectors of a write, the queries of a search) travel as raw buffers: the header describes each one
(`Array`: dtype and shape) and its bytes follow as a frame of their own, in the order of the header's fields.

    Upsert   [header, vectors(, indptr, indices, values)]    Search [header, queries (none: lexical, sparse)]
    Feed     [header, vectors(, indptr, indices, values)]    any other request or answer: [header]

(the three arrays after a write's vectors: its sparse vectors, where the collection keeps them: base.SparseRows)

Two calls stream: `Scan` opens a stream whose pages `Next` pulls, `Replace` one that `Feed` pushes batches
into and `End` finishes (or `Abort` abandons).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec
import numpy as np

from service.index.base import (
    CollectionInfo,
    CollectionSpec,
    Document,
    Hit,
    Record,
    SearchParams,
    SparseRows,
    WriteResult,
)
from service.ipc.stream import Buffer


class Op(enum.IntEnum):
    """Every message's kind: its tag, the first element of its header on the wire."""

    # asked of the index process: a VectorIndex call each
    CREATE_COLLECTION = 1  # → Collection
    DROP_COLLECTION = 2  # → Written
    LIST_COLLECTIONS = 3  # → Collections
    INFO = 4  # → Collection
    UPSERT = 5  # → Written
    GET = 6  # → Records
    DELETE = 7  # → Written
    CLEAR = 8  # → Written
    SEARCH = 9  # → Hits
    SCAN = 10  # → Opened: a stream of pages of records
    NEXT = 11  # → Page: the stream's next page (None once it is done)
    REPLACE = 12  # → Opened: a stream the client feeds (documents, vectors) batches into
    FEED = 13  # → Taken
    ABORT = 14  # → Taken: the replacement is abandoned (the collection stays as it was)
    END = 15  # → Written: the replacement switched in
    # the index process's answers
    COLLECTION = 16
    COLLECTIONS = 17
    WRITTEN = 18
    RECORDS = 19
    HITS = 20
    OPENED = 21
    PAGE = 22
    TAKEN = 23
    FAILED = 24


#: the dtype kinds an array may have: bool, signed and unsigned integers, floats
ARRAY_KINDS = "biuf"


class Array(msgspec.Struct, array_like=True, frozen=True):
    """A numpy array sent as a frame of its own after the header."""

    dtype: str  # numpy's spelling, byte order included: "<f4"
    shape: tuple[int, ...]


class SparseArrays(msgspec.Struct, array_like=True, frozen=True):
    """A write's sparse vectors (base.SparseRows): three arrays, each a frame of its own after the vectors'."""

    indptr: Array
    indices: Array
    values: Array


def sparse_arrays(rows: SparseRows | None) -> tuple[SparseArrays | None, list[Buffer]]:
    """A write's sparse vectors for its header, and their bytes for the frames after its vectors'."""
    if rows is None:
        return None, []
    described, data = zip(*(array(a) for a in rows))
    return SparseArrays(*described), list(data)


def sparse_rows(arrays: list[np.ndarray]) -> SparseRows | None:
    """The sparse vectors a write's arrays after its vectors hold, if any."""
    return SparseRows(*arrays[1:4]) if len(arrays) == 4 else None


# --- requests ---------------------------------------------------------------------------------------


class CreateCollection(msgspec.Struct, tag=Op.CREATE_COLLECTION.value, array_like=True, frozen=True):
    spec: CollectionSpec
    exist_ok: bool = False


class DropCollection(msgspec.Struct, tag=Op.DROP_COLLECTION.value, array_like=True, frozen=True):
    name: str


class ListCollections(msgspec.Struct, tag=Op.LIST_COLLECTIONS.value, array_like=True, frozen=True):
    pass


class Info(msgspec.Struct, tag=Op.INFO.value, array_like=True, frozen=True):
    name: str


class Upsert(msgspec.Struct, tag=Op.UPSERT.value, array_like=True, frozen=True):
    name: str
    documents: list[Document]
    vectors: Array
    sparse: SparseArrays | None = None


class Get(msgspec.Struct, tag=Op.GET.value, array_like=True, frozen=True):
    name: str
    ids: list[str]
    with_vector: bool = False


class Delete(msgspec.Struct, tag=Op.DELETE.value, array_like=True, frozen=True):
    name: str
    ids: list[str] | None = None
    filter: dict[str, Any] | None = None


class Clear(msgspec.Struct, tag=Op.CLEAR.value, array_like=True, frozen=True):
    name: str


class Search(msgspec.Struct, tag=Op.SEARCH.value, array_like=True, frozen=True):
    name: str
    queries: Array | None  # None: a lexical search, by params.texts
    params: SearchParams


class Scan(msgspec.Struct, tag=Op.SCAN.value, array_like=True, frozen=True):
    name: str
    batch: int = 1000


class Next(msgspec.Struct, tag=Op.NEXT.value, array_like=True, frozen=True):
    stream: int


class Replace(msgspec.Struct, tag=Op.REPLACE.value, array_like=True, frozen=True):
    spec: CollectionSpec


class Feed(msgspec.Struct, tag=Op.FEED.value, array_like=True, frozen=True):
    stream: int
    documents: list[Document]
    vectors: Array
    sparse: SparseArrays | None = None


class Abort(msgspec.Struct, tag=Op.ABORT.value, array_like=True, frozen=True):
    stream: int


class End(msgspec.Struct, tag=Op.END.value, array_like=True, frozen=True):
    stream: int


Request = (CreateCollection | DropCollection | ListCollections | Info | Upsert | Get | Delete | Clear | Search | Scan
           | Next | Replace | Feed | Abort | End)

# --- answers ----------------------------------------------------------------------------------------


class Collection(msgspec.Struct, tag=Op.COLLECTION.value, array_like=True, frozen=True):
    info: CollectionInfo


class Collections(msgspec.Struct, tag=Op.COLLECTIONS.value, array_like=True, frozen=True):
    collections: list[CollectionInfo]


class Written(msgspec.Struct, tag=Op.WRITTEN.value, array_like=True, frozen=True):
    result: WriteResult


class Records(msgspec.Struct, tag=Op.RECORDS.value, array_like=True, frozen=True):
    records: list[Record]


class Hits(msgspec.Struct, tag=Op.HITS.value, array_like=True, frozen=True):
    hits: list[list[Hit]]


class Opened(msgspec.Struct, tag=Op.OPENED.value, array_like=True, frozen=True):
    stream: int


class Page(msgspec.Struct, tag=Op.PAGE.value, array_like=True, frozen=True):
    records: list[Record] | None  # None: the scan is done


class Taken(msgspec.Struct, tag=Op.TAKEN.value, array_like=True, frozen=True):
    pass


class Failed(msgspec.Struct, tag=Op.FAILED.value, array_like=True, frozen=True):
    """A call the index refused or failed: `error` names the VectorIndexError class the client raises."""

    error: str
    message: str
    status: int


Reply = Collection | Collections | Written | Records | Hits | Opened | Page | Taken | Failed
Answer = TypeVar("Answer", bound=Reply)

# --- framing ---------------------------------------------------------------------------------------


def _enc_hook(value: Any) -> Any:
    if isinstance(value, np.generic):  # a numpy scalar in a result (a score, an offset): its Python value
        return value.item()
    raise NotImplementedError(f"cannot send {type(value).__name__} to or from the index process")


_encode = msgspec.msgpack.Encoder(enc_hook=_enc_hook).encode
_decode_request = msgspec.msgpack.Decoder(Request).decode
_decode_replies: dict[type, Callable[[Buffer], Any]] = {
    answer: msgspec.msgpack.Decoder(answer | Failed).decode
    for answer in (Collection, Collections, Written, Records, Hits, Opened, Page, Taken)}


def array(values: np.ndarray) -> tuple[Array, Buffer]:
    """An array's description for the header, and its bytes for the frame after it."""
    values = np.ascontiguousarray(values)
    return Array(values.dtype.str, values.shape), values.data


def encode(message: Request | Reply, *buffers: Buffer) -> list[Buffer]:
    """A message as its frames: the header, then its arrays' bytes."""
    return [_encode(message), *buffers]


def decode_request(frames: Sequence[Buffer]) -> tuple[Request, list[np.ndarray]]:
    """A request and its arrays (views of the frames), in the order of its Array fields. Anything but one of the
    requests above, with exactly its arrays, raises msgspec.ValidationError (or DecodeError)."""
    if not frames:
        raise msgspec.ValidationError("a message of no frames")
    head, *buffers = frames
    request = _decode_request(head)
    described = [value for value in (getattr(request, f) for f in request.__struct_fields__)
                 if isinstance(value, Array)]
    sparse = getattr(request, "sparse", None)
    if sparse is not None:
        described += [sparse.indptr, sparse.indices, sparse.values]
    if len(described) != len(buffers):
        raise msgspec.ValidationError(f"{type(request).__name__} describes {len(described)} array(s) and "
                                      f"{len(buffers)} came")
    return request, [_array(a, b) for a, b in zip(described, buffers)]


def _array(described: Array, buffer: Buffer) -> np.ndarray:
    try:
        dtype = np.dtype(described.dtype)
    except TypeError as e:
        raise msgspec.ValidationError(f"an array of dtype {described.dtype!r}: {e}") from None
    if dtype.kind not in ARRAY_KINDS or any(n < 0 for n in described.shape):
        raise msgspec.ValidationError(f"an array of dtype {described.dtype!r} and shape {described.shape}")
    size = memoryview(buffer).nbytes
    if size != dtype.itemsize * math.prod(described.shape):
        raise msgspec.ValidationError(f"an array of dtype {described.dtype} and shape {described.shape} "
                                      f"in {size} bytes")
    return np.frombuffer(buffer, dtype=dtype).reshape(described.shape)


def decode_reply(answer: type[Answer], frame: Buffer) -> Answer | Failed:
    """An answer of the kind its request gets (the Op's comment), or Failed; anything else raises
    msgspec.ValidationError."""
    reply: Answer | Failed = _decode_replies[answer](frame)
    return reply
