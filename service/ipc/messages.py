"""What crosses between the API processes and an engine process, and how it is framed.

A request is a batch of already-tokenised inputs; the answer is a float32 matrix. Both travel as
raw array buffers, the frames of a message (vLLM's `serial_utils`: arrays as buffers, never pickled), with
one small header per message: a msgspec struct tagged with its `Op` (vLLM's `v1/engine` messages), so a header
that is not one of them is refused by the decoder, never dispatched. No per-text Python object is serialised:

    Embed    [header (rows n), offsets int64 [n+1] + ids int32 (all rows end to end) + type_ids int8
             (or nothing), in one buffer]
    Vectors  [header, vectors float32 [n, dim]]; for an Embed with `tokens` (TEI's /embed_all), every row's
             token states end to end instead, float32 [total tokens, hidden], rows as the request's offsets
    Failed   [header: the error's kind and message]

A request is one buffer, and a bundle of messages (Requests, Replies) carries all their headers in its first frame.

The engine's failure kinds are defined here, so both sides raise and catch the same classes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain
from typing import Any

import msgspec
import numpy as np

from service.ipc.stream import Buffer

# --- the token batch -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenBatch:
    """n inputs' token ids end to end (row i is ids[offsets[i]:offsets[i+1]]): one buffer per field,
    whatever the number of inputs."""

    ids: np.ndarray  # int32 [total]
    offsets: np.ndarray  # int64 [n + 1]
    type_ids: np.ndarray | None = None  # int8 [total], for models that take token_type_ids

    @classmethod
    def from_rows(cls, rows: list[list[int]], type_rows: list[list[int]] | None = None) -> TokenBatch:
        offsets = np.fromiter(accumulate(map(len, rows), initial=0), dtype=np.int64, count=len(rows) + 1)
        total = int(offsets[-1])
        ids = np.fromiter(chain.from_iterable(rows), dtype=np.int32, count=total)
        types = None if type_rows is None else np.fromiter(chain.from_iterable(type_rows), dtype=np.int8, count=total)
        return cls(ids, offsets, types)

    @classmethod
    def concat(cls, batches: list[TokenBatch]) -> TokenBatch:
        """The rows of `batches`, one after the other (a pass from its requests' shares)."""
        if len(batches) == 1:
            return batches[0]
        ids = np.concatenate([b.ids for b in batches])
        offsets = _offsets(np.concatenate([b.lengths for b in batches]))
        types = None
        if any(b.type_ids is not None for b in batches):  # a batch without them (token ids a client sent): zeros
            types = np.concatenate([np.zeros(len(b.ids), np.int8) if b.type_ids is None else b.type_ids
                                    for b in batches])
        return cls(ids, offsets, types)

    def slice(self, start: int, stop: int) -> TokenBatch:
        """Rows start..stop-1, as views of this batch's buffers."""
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        types = None if self.type_ids is None else self.type_ids[first:last]
        return TokenBatch(self.ids[first:last], self.offsets[start:stop + 1] - first, types)

    def take(self, rows: np.ndarray) -> TokenBatch:
        """The given rows, in that order (whole-array work: no Python step per row)."""
        lengths = self.lengths[rows]
        offsets = _offsets(lengths)
        # each token's source: its row's start there, plus its place in its row
        source = np.repeat(self.offsets[rows] - offsets[:-1], lengths) + np.arange(offsets[-1])
        return TokenBatch(self.ids[source], offsets, None if self.type_ids is None else self.type_ids[source])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        lengths: np.ndarray = self.offsets[1:] - self.offsets[:-1]  # np.diff's Python wrapper costs 4x this
        return lengths

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1])

    def row(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i]:self.offsets[i + 1]]

    def type_row(self, i: int) -> np.ndarray | None:
        return None if self.type_ids is None else self.type_ids[self.offsets[i]:self.offsets[i + 1]]


def _offsets(lengths: np.ndarray) -> np.ndarray:
    """Row offsets [n + 1] of rows of these lengths laid end to end."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


# --- what an engine says about its model ----------------------------------------------------------


@dataclass(frozen=True)
class ModelInfo:
    """The served graph, as the routes need it (the engine's backend fills it in)."""

    model: str  # the export's name, what the API reports as `model`
    dimension: int
    max_seq_length: int
    device: str  # "cpu" | "cuda"
    variant: str = "fp32"  # which graph of the export: fp32, int8, fp16
    manifest: dict[str, Any] = field(default_factory=dict)
    vocab_size: int | None = None  # token ids a client sends must be below it
    graph_sha256: str = ""  # of the graph that makes the vectors: what stamps a collection of them
    kind: str = "embedding"  # "cross-encoder": one score per row, as a [n, 1] "vector"; "classifier": [n, labels]
    max_batch_tokens: int = 0  # the engine's pass budget, as /info reports it
    token_dimension: int = 0  # the hidden size of the graph's token output (/embed_all); 0: the graph has none
    tokenizer: str = "export"  # what the API process tokenises with: the export's ("export"), or "words" (the fake
    # backend's service.tokenization.WordTokenizer)

    @property
    def is_cross_encoder(self) -> bool:
        return self.kind == "cross-encoder"

    @property
    def is_classifier(self) -> bool:
        return self.kind == "classifier"

    @property
    def is_sparse(self) -> bool:
        return self.kind == "sparse"

    @property
    def gives_embeddings(self) -> bool:
        return self.kind == "embedding"

    @property
    def described(self) -> str:
        """What the model is and where it answers, for the refusals of the routes it cannot serve."""
        return {"cross-encoder": "a reranker (cross-encoder): it scores (query, text) pairs at /rerank",
                "classifier": "a classifier: it labels texts and text pairs at /predict",
                "sparse": "a sparse (SPLADE) model: it answers /embed_sparse, and /embed with normalize=false"}.get(
                    self.kind, "an embedding model")


    @property
    def token_refusal(self) -> str:
        """Why this model gives no token states (TEI's /embed_all): TEI's own sentence first, then what to do."""
        if self.is_sparse:
            return f"`embed_all` is not available for SPLADE models: model {self.model} is {self.described}"
        if not self.gives_embeddings:
            return f"Model is not an embedding model: model {self.model} is {self.described}"
        return (f"`embed_all` is not available for this export: the {self.variant} graph of {self.model} has no "
                "token output (exported before /embed_all existed): re-export it with `python -m export` to serve "
                "token embeddings")


@dataclass
class EmbedResult:
    vectors: np.ndarray  # [n, dim] float32, normalised or as pooled
    prompt_tokens: int
    queue_s: float
    inference_s: float
    tokenization_s: float = 0.0  # filled in by the API process, which tokenised
    row_tokens: np.ndarray | None = None  # each row's tokens, where the API process tokenised or cached them


# --- failures --------------------------------------------------------------------------------------


class EngineError(Exception):
    """A request the engine will not or cannot serve; the routes map each kind to a status."""

    retry_after_s: float | None = None


class Overloaded(EngineError):
    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InvalidInput(EngineError):
    pass


class InputTooLong(InvalidInput):
    pass


class NotReady(EngineError):
    pass


class EngineUnavailable(NotReady):
    """The engine process died or does not answer: in-flight requests get this, not a hang."""


class InferenceFailed(EngineError):
    pass


class QueueDeadline(EngineError):
    pass


class WrongModelType(EngineError):
    """Embeddings asked of a reranker (cross-encoder), or pair scores of an embedding model."""


ERRORS: dict[str, type[EngineError]] = {c.__name__: c for c in (
    EngineError, Overloaded, InvalidInput, InputTooLong, NotReady, EngineUnavailable, InferenceFailed,
    QueueDeadline, WrongModelType)}


# --- the messages ----------------------------------------------------------------------------------


class Op(enum.IntEnum):
    """Every message's kind: its tag, the first element of its header on the wire (vLLM's EngineCoreRequestType).
    A header whose tag or fields are not one of these messages' is a `msgspec.ValidationError`, never dispatched."""

    # asked of the engine
    HELLO = 1  # → Welcome: the model's info (what the API process needs to validate and answer)
    PING = 2  # → Pong: alive, ready, queue stats (the clients' heartbeat: a hung engine is noticed)
    EMBED = 3  # → Vectors (with `tokens`: every row's token states), or Failed
    CANCEL = 4  # the caller left: its rows not yet run are dropped (no answer)
    HEALTH = 5  # → Healthy after a real forward pass (TEI's /health), or Failed
    # the engine's answers
    WELCOME = 6
    PONG = 7
    VECTORS = 8
    HEALTHY = 9
    FAILED = 10
    # several messages of either direction as one
    BUNDLE = 11


# Headers are msgspec structs encoded as arrays (tag first, trailing defaults left out): a few bytes each, and
# encoded and decoded by msgspec's C code. The arrays themselves travel as the message's other frames.


class Hello(msgspec.Struct, tag=Op.HELLO.value, array_like=True, frozen=True):
    id: int


class Ping(msgspec.Struct, tag=Op.PING.value, array_like=True, frozen=True):
    id: int = 0  # not a request the client waits on: its answer is matched by kind


class Embed(msgspec.Struct, tag=Op.EMBED.value, array_like=True, frozen=True):
    """Embed the `rows` rows of the token batch in the message's one buffer (`batch_frames`)."""

    id: int
    rows: int
    normalize: bool = True
    timeout_s: float | None = None
    tokens: bool = False  # TEI's /embed_all: every row's token states instead of its vector


class Cancel(msgspec.Struct, tag=Op.CANCEL.value, array_like=True, frozen=True):
    id: int


class Health(msgspec.Struct, tag=Op.HEALTH.value, array_like=True, frozen=True):
    id: int


Request = Hello | Ping | Embed | Cancel | Health


class Welcome(msgspec.Struct, tag=Op.WELCOME.value, array_like=True, frozen=True):
    id: int
    info: ModelInfo
    pid: int


class Pong(msgspec.Struct, tag=Op.PONG.value, array_like=True, frozen=True):
    id: int
    ready: bool
    pid: int
    in_flight: int
    queued_rows: int
    tokens_per_s: float | None


class Vectors(msgspec.Struct, tag=Op.VECTORS.value, array_like=True, frozen=True):
    """The answer to an Embed: float32 `shape` in the message's one buffer, and where the time went."""

    id: int
    shape: tuple[int, int]
    prompt_tokens: int
    queue_s: float
    inference_s: float


class Healthy(msgspec.Struct, tag=Op.HEALTHY.value, array_like=True, frozen=True):
    id: int


class Failed(msgspec.Struct, tag=Op.FAILED.value, array_like=True, frozen=True):
    """A request the engine will not or cannot serve: `error` names the EngineError class the client raises."""

    id: int
    error: str
    message: str
    retry_after_s: float | None = None

    @classmethod
    def of(cls, request_id: int, error: BaseException) -> Failed:
        kind = type(error).__name__ if type(error).__name__ in ERRORS else "InferenceFailed"
        retry = error.retry_after_s if isinstance(error, EngineError) else None
        return cls(request_id, kind, str(error), retry)

    def exception(self) -> EngineError:
        error = ERRORS.get(self.error, EngineError)(self.message)
        error.retry_after_s = self.retry_after_s
        return error


Reply = Welcome | Pong | Vectors | Healthy | Failed


class Requests(msgspec.Struct, tag=Op.BUNDLE.value, array_like=True, frozen=True):
    """Several requests as one message: `sizes` buffers each, joined in one frame of `lengths` where small."""

    messages: list[Request]
    sizes: list[int]
    lengths: list[int] | None = None


class Replies(msgspec.Struct, tag=Op.BUNDLE.value, array_like=True, frozen=True):
    """Several answers as one message, as `Requests`."""

    messages: list[Reply]
    sizes: list[int]
    lengths: list[int] | None = None


# --- framing ---------------------------------------------------------------------------------------

#: a message's frames: its header, then its buffers (bytes, or views of arrays and of what was received)
Frames = list[Buffer]

_encode = msgspec.msgpack.Encoder().encode
_decode_requests = msgspec.msgpack.Decoder(Request | Requests).decode
_decode_replies = msgspec.msgpack.Decoder(Reply | Replies).decode

#: a bundle whose buffers come to less than this travels as two frames, the headers and the buffers joined; larger
#: buffers go as frames of their own, uncopied. Each frame costs Python work on both sides; over the engine's
#: socket (service/ipc/stream.py) `python -m benchmarks.micro` measures joined and a frame each alike (RESULTS.md)
JOIN_BELOW = 65536


def encode(message: Request | Reply, *buffers: Buffer) -> Frames:
    """One message as its frames."""
    return [_encode(message), *buffers]


def bundle_requests(messages: Sequence[tuple[Request, Frames]]) -> Frames:
    """Several requests (each a header and its buffers) as one message: see `_bundle`."""
    if len(messages) == 1:
        return encode(messages[0][0], *messages[0][1])
    sizes, buffers, lengths = _gather(messages)
    return _bundled(Requests([m for m, _ in messages], sizes, lengths), buffers, lengths)


def bundle_replies(messages: Sequence[tuple[Reply, Frames]]) -> Frames:
    """Several answers as one message: see `_bundle`."""
    if len(messages) == 1:
        return encode(messages[0][0], *messages[0][1])
    sizes, buffers, lengths = _gather(messages)
    return _bundled(Replies([m for m, _ in messages], sizes, lengths), buffers, lengths)


def _gather(messages: Sequence[tuple[Request | Reply, Frames]]) -> tuple[list[int], Frames, list[int] | None]:
    """Under load a process sends and receives once per turn of its loop, not once per request. The headers travel
    together in the first frame, then every message's buffers: joined in one frame where they are small (then
    `lengths` says where each begins)."""
    sizes = [len(buffers) for _, buffers in messages]
    buffers = [b for _, message_buffers in messages for b in message_buffers]
    lengths = [memoryview(b).nbytes for b in buffers]
    return sizes, buffers, lengths if buffers and sum(lengths) < JOIN_BELOW else None


def _bundled(header: Requests | Replies, buffers: Frames, lengths: list[int] | None) -> Frames:
    return [_encode(header), b"".join(buffers)] if lengths is not None else [_encode(header), *buffers]


def decode_requests(frames: Sequence[Buffer]) -> list[tuple[Request, Frames]]:
    """The requests in one message (one, or a bundle's), each with its buffers; a header that is not one of the
    messages above raises msgspec.ValidationError (or DecodeError)."""
    head, *buffers = frames
    message = _decode_requests(head)
    if isinstance(message, Requests):
        return list(zip(message.messages, _split(message.sizes, message.lengths, buffers)))
    return [(message, buffers)]


def decode_replies(frames: Sequence[Buffer]) -> list[tuple[Reply, Frames]]:
    """The answers in one message, as `decode_requests`."""
    head, *buffers = frames
    message = _decode_replies(head)
    if isinstance(message, Replies):
        return list(zip(message.messages, _split(message.sizes, message.lengths, buffers)))
    return [(message, buffers)]


def _split(sizes: list[int], lengths: list[int] | None, frames: Frames) -> list[Frames]:
    """Each bundled message's buffers: views of the one joined frame, or its own frames."""
    if lengths is not None:
        joined, frames, at = memoryview(frames[0]), [], 0
        for n in lengths:
            frames.append(joined[at:at + n])
            at += n
    out, at = [], 0
    for size in sizes:
        out.append(frames[at:at + size])
        at += size
    return out


def batch_frames(batch: TokenBatch) -> Frames:
    """A TokenBatch as one buffer: offsets, ids, then type ids if any (the header says how many rows)."""
    # ndarray.data: the array's buffer as a memoryview (numpy's stubs give memoryview(array) only on 3.12+)
    parts = [np.ascontiguousarray(batch.offsets, np.int64).data, np.ascontiguousarray(batch.ids, np.int32).data]
    if batch.type_ids is not None:
        parts.append(np.ascontiguousarray(batch.type_ids, np.int8).data)
    return [b"".join(parts)]


def batch_from_frames(rows: int, payload: Buffer) -> TokenBatch:
    """The TokenBatch of `rows` rows that batch_frames wrote into `payload` (views of it, no copy)."""
    offsets = np.frombuffer(payload, dtype=np.int64, count=rows + 1)
    tokens, at = int(offsets[-1]), 8 * (rows + 1)
    ids = np.frombuffer(payload, dtype=np.int32, count=tokens, offset=at)
    at += 4 * tokens
    size = memoryview(payload).nbytes
    if size not in (at, at + tokens):
        raise ValueError(f"a token batch of {rows} rows and {tokens} tokens in {size} bytes")
    type_ids = np.frombuffer(payload, dtype=np.int8, count=tokens, offset=at) if size > at else None
    return TokenBatch(ids, offsets, type_ids)
