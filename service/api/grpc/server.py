"""TEI's gRPC services (Info, Embed, Predict, Rerank, Tokenize and their streams) on grpcio's aio server, in the
API process's event loop, beside HTTP: the same models (`registry`), the same route functions
(service/api/routes/tei.py), the same API keys, the same limits.

- A model is picked by the call's `model` metadata, as the JSON routes' `model` field picks one (TEI's proto has
  no such field); none: the default model.
- Errors take TEI's codes (its router/src/grpc/server.rs maps its error types so): a request the model cannot
  serve is FAILED_PRECONDITION (HTTP's 424), bad input INVALID_ARGUMENT (422), no room RESOURCE_EXHAUSTED (429,
  with `retry-after` in the trailing metadata), an unknown model NOT_FOUND, a missing or wrong key
  UNAUTHENTICATED, not ready UNAVAILABLE. Messages are parsed here, not by grpcio (whose answer to bytes that
  do not parse is INTERNAL): a malformed one is INVALID_ARGUMENT.
- A message over max_request_bytes is refused by grpcio itself (RESOURCE_EXHAUSTED); a stream is held to what
  one HTTP request may carry: max_client_batch_size messages (more: INVALID_ARGUMENT) and max_request_bytes in
  all (more: RESOURCE_EXHAUSTED). A stream's messages run concurrently, as TEI runs them, and are answered in
  order; the first one refused ends the stream with its status, after the answers before it.
- Embed's messages, single calls' and streams' alike, go to the engine in batches (TeiService._submit): those
  that arrive while the process has one at the model's engine go together as the next, one /embed request.
- `truncate` is the proto's plain bool, as TEI reads it: false (the default) refuses an input over the model's
  length (INVALID_ARGUMENT) whatever SEMBED_AUTO_TRUNCATE says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service.api.auth import ApiKeys
from service.api.errors import ApiError, to_api_error
from service.api.grpc import tei_pb2 as pb
from service.api.middleware import CLIENT_CLOSED
from service.api.registry import ModelRegistry, ServedModel
from service.api.routes import tei
from service.api.routes.ops import tei_info
from service.ipc.messages import EmbedResult
from service.settings import Settings

log = logging.getLogger("sembed.grpc")

#: the call metadata that names the model (the JSON routes' `model` field)
MODEL_KEY = "model"
PACKAGE = "tei.v1"

_BY_STATUS = {408: grpc.StatusCode.DEADLINE_EXCEEDED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
              499: grpc.StatusCode.CANCELLED, 501: grpc.StatusCode.UNIMPLEMENTED}
# TEI's mapping of its error types, and ours beside them
_BY_TYPE = {"Validation": grpc.StatusCode.INVALID_ARGUMENT, "Overloaded": grpc.StatusCode.RESOURCE_EXHAUSTED,
            "Unhealthy": grpc.StatusCode.UNAVAILABLE, "Backend": grpc.StatusCode.FAILED_PRECONDITION,
            "Tokenizer": grpc.StatusCode.FAILED_PRECONDITION, "NotFound": grpc.StatusCode.NOT_FOUND,
            "Unauthorized": grpc.StatusCode.UNAUTHENTICATED}
_DIRECTIONS: dict[int, str] = {pb.TRUNCATION_DIRECTION_RIGHT: "Right", pb.TRUNCATION_DIRECTION_LEFT: "Left"}
_MODEL_TYPES: dict[str, pb.ModelType] = {"reranker": pb.MODEL_TYPE_RERANKER, "classifier": pb.MODEL_TYPE_CLASSIFIER,
                "embedding": pb.MODEL_TYPE_EMBEDDING}

M = TypeVar("M", bound=Message)
Answer = Callable[[ServedModel, Any], Awaitable[Message | bytes]]
Submit = Callable[[ServedModel, Any], "asyncio.Future[bytes]"]


def status_code(error: ApiError) -> grpc.StatusCode:
    """The gRPC status of an error the HTTP routes would answer with `error.status`."""
    code = _BY_STATUS.get(error.status) or _BY_TYPE.get(error.error_type)
    if code is None:
        code = grpc.StatusCode.INTERNAL if error.status >= 500 else grpc.StatusCode.INVALID_ARGUMENT
    return code


def _parse(kind: type[M], raw: bytes) -> M:
    try:
        return kind.FromString(raw)
    except DecodeError as e:  # a wrong wire type, a truncated field, a string that is not UTF-8
        raise ApiError(422, f"the message is not a {PACKAGE}.{kind.__name__}: {e}", "Validation") from None


def _direction(value: int) -> str:
    try:
        return _DIRECTIONS[value]
    except KeyError:
        raise ApiError(422, f"truncation_direction {value} is not a TruncationDirection (0: right, 1: left)",
                       "Validation", param="truncation_direction") from None


def _optional(message: Message, field: str) -> Any:
    return getattr(message, field) if message.HasField(field) else None


def _metadata(chars: int, result: EmbedResult, start: float, tokens: int | None = None) -> pb.Metadata:
    return pb.Metadata(compute_chars=chars, compute_tokens=result.prompt_tokens if tokens is None else tokens,
                       total_time_ns=int((time.perf_counter() - start) * 1e9),
                       tokenization_time_ns=int(result.tokenization_s * 1e9), queue_time_ns=int(result.queue_s * 1e9),
                       inference_time_ns=int(result.inference_s * 1e9))


@dataclass
class _Call:
    route: str
    status: int = 200  # the HTTP status its answer stands for, in the request metrics


def _serialize(message: Message | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def embed_response(vector: np.ndarray, metadata: bytes) -> bytes:
    """An EmbedResponse on the wire, from a vector and its serialised Metadata. tei.proto's `repeated float
    embeddings = 1` is packed: a length, then the floats little-endian, back to back, which is the float32 row's
    own bytes; building the message instead makes a Python float of every element and converts it back, the
    costliest step of a call. `metadata = 2` follows as a length-delimited message."""
    floats = vector.astype("<f4", copy=False).tobytes()
    embeddings = b"\x0a" + _varint(len(floats)) + floats if floats else b""  # proto3 leaves an empty field out
    return embeddings + b"\x12" + _varint(len(metadata)) + metadata


class _Lane:
    """One model's single Embed calls on their way to its engine (TeiService.embed)."""

    __slots__ = ("in_flight", "waiting")

    def __init__(self) -> None:
        self.in_flight = 0  # batches at the engine
        self.waiting: list[tuple[pb.EmbedRequest, float, asyncio.Future]] = []  # (request, its start, its answer)


class TeiService:
    """The handlers of tei.proto's five services. Requests arrive as bytes (no deserializer given to grpcio) and
    are parsed by `_parse`, so a malformed one is answered as bad input."""

    def __init__(self, registry: ModelRegistry, settings: Settings, keys: ApiKeys, version: str):
        self.registry = registry
        self.settings = settings
        self.keys = keys
        self.version = version
        self.max_batch = settings.max_client_batch_size
        self._lanes: dict[int, _Lane] = {}  # by id() of the ServedModel
        self._batches: set[asyncio.Future] = set()  # batches of waiting calls being answered

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        # service → rpc → (its request message, the answer to one; for a stream: how a message joins a batch, if so)
        services: dict[str, dict[str, tuple]] = {
            "Info": {"Info": (pb.InfoRequest, self.info)},
            "Embed": {"Embed": (pb.EmbedRequest, self.embed),
                      "EmbedStream": (pb.EmbedRequest, self.embed, self._submit),
                      "EmbedSparse": (pb.EmbedSparseRequest, self.embed_sparse),
                      "EmbedSparseStream": (pb.EmbedSparseRequest, self.embed_sparse, None),
                      "EmbedAll": (pb.EmbedAllRequest, self.embed_all),
                      "EmbedAllStream": (pb.EmbedAllRequest, self.embed_all, None)},
            "Predict": {"Predict": (pb.PredictRequest, self.predict),
                        "PredictPair": (pb.PredictPairRequest, self.predict_pair),
                        "PredictStream": (pb.PredictRequest, self.predict, None),
                        "PredictPairStream": (pb.PredictPairRequest, self.predict_pair, None)},
            "Rerank": {"Rerank": (pb.RerankRequest, self.rerank)},
            "Tokenize": {"Tokenize": (pb.EncodeRequest, self.tokenize),
                         "TokenizeStream": (pb.EncodeRequest, self.tokenize, None),
                         "Decode": (pb.DecodeRequest, self.decode),
                         "DecodeStream": (pb.DecodeRequest, self.decode, None)},
        }
        handlers = []
        for service, rpcs in services.items():
            methods = {rpc: self._unary(f"/{PACKAGE}.{service}/{rpc}", *spec) if len(spec) == 2 else
                       self._stream(f"/{PACKAGE}.{service}/{rpc}", *spec) for rpc, spec in rpcs.items()}
            if service == "Rerank":  # a stream in, one answer out
                methods["RerankStream"] = grpc.stream_unary_rpc_method_handler(self._rerank_stream,
                                                                               response_serializer=_serialize)
            handlers.append(grpc.method_handlers_generic_handler(f"{PACKAGE}.{service}", methods))
        return handlers

    # --- what every call does first, and how it ends ---------------------------------------------------------
    def _model(self, context: grpc.aio.ServicerContext, route: str) -> ServedModel:
        """The key checked as HTTP checks it, then the model the call names (or the default)."""
        authorization = name = None
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                authorization = value
            elif key == MODEL_KEY:
                name = value
        refused = self.keys.check(route, authorization.encode() if authorization else None)
        if refused is not None:
            raise refused
        return self.registry.get(name)

    @contextlib.contextmanager
    def _counted(self, route: str) -> Iterator[_Call]:
        """The call in the API process's request metrics as HTTP's requests are: by route (the gRPC method) and
        the HTTP status its answer stands for (200, the error's, 499 where the client left)."""
        call, start = _Call(route), time.perf_counter()
        try:
            yield call
        except (asyncio.CancelledError, GeneratorExit):
            call.status = CLIENT_CLOSED
            raise
        finally:
            metrics = self.registry.metrics
            metrics.requests.labels(route, str(call.status)).inc()
            metrics.request_seconds.labels(route).observe(time.perf_counter() - start)

    async def _abort(self, context: grpc.aio.ServicerContext, exc: Exception, call: _Call) -> None:
        error = to_api_error(exc, self.settings.retry_after_s)
        call.status = error.status
        self.registry.metrics.request_errors.labels(call.route, error.error_type).inc()
        if error.status >= 500 and error.status not in (501, 503):
            log.error("gRPC call %s failed", call.route, exc_info=exc)
        retry = [("retry-after", v) for k, v in error.headers.items() if k.lower() == "retry-after"]
        await context.abort(status_code(error), error.message, tuple(retry))

    def _unary(self, route: str, kind: type[Message], answer: Answer) -> grpc.RpcMethodHandler:
        async def call(raw: bytes, context: grpc.aio.ServicerContext) -> Message | bytes:
            with self._counted(route) as counted:
                try:
                    served = self._model(context, route)
                    return await answer(served, _parse(kind, raw))
                except Exception as e:
                    await self._abort(context, e, counted)
                    raise  # abort raised already: for the type checker

        return grpc.unary_unary_rpc_method_handler(call, response_serializer=_serialize)

    def _stream(self, route: str, kind: type[Message], answer: Answer,
                submit: Submit | None = None) -> grpc.RpcMethodHandler:
        """A stream's messages answered in order, each started as it arrives: a task each, or with `submit` handed
        to the batches that carry the process's other calls to the model (no task of its own; a client that streams
        a batch, as tei-client does, costs the engine a few requests, not one per text). The first refused ends the
        stream with its status, after the answers before it. Read and written with the context's read() and
        write(): an async generator on either side costs a message more."""
        async def call(_: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
            queue: asyncio.Queue[asyncio.Future | None] = asyncio.Queue()
            reader: asyncio.Future | None = None
            try:
                with self._counted(route) as counted:
                    try:
                        served = self._model(context, route)
                        reader = asyncio.ensure_future(self._read(context, kind, served, answer, submit, queue))
                        while (item := await queue.get()) is not None:
                            await context.write(await item)
                    except Exception as e:
                        await self._abort(context, e, counted)
            finally:
                if reader is not None:
                    reader.cancel()
                while not queue.empty():  # the answers nobody will read
                    left = queue.get_nowait()
                    if left is not None:
                        left.cancel()
                        if left.done() and not left.cancelled():
                            left.exception()  # retrieved: no "never retrieved" warning

        return grpc.stream_stream_rpc_method_handler(call, response_serializer=_serialize)

    async def _read(self, context: grpc.aio.ServicerContext, kind: type[Message], served: ServedModel,
                    answer: Answer, submit: Submit | None, queue: asyncio.Queue[asyncio.Future | None]) -> None:
        """Each message of a stream, started as it arrives; a refusal ends the stream where it stands."""
        n = size = 0
        try:
            while (raw := await context.read()) is not grpc.aio.EOF:
                n += 1
                size += len(raw)
                self._within_limits(n, size)
                parsed = _parse(kind, raw)
                queue.put_nowait(submit(served, parsed) if submit is not None else
                                 asyncio.ensure_future(answer(served, parsed)))
        except Exception as e:
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(e)
            queue.put_nowait(failed)
        else:
            queue.put_nowait(None)

    def _within_limits(self, n: int, size: int) -> None:
        """A stream of `n` messages, `size` bytes so far, held to one HTTP request's limits."""
        if n > self.max_batch:
            raise ApiError(422, f"more than {self.max_batch} messages in one stream; the limit "
                                "(max_client_batch_size) is one request's: open another stream", "Validation")
        if size > self.settings.max_request_bytes:
            raise ApiError(413, f"the stream's messages are over {self.settings.max_request_bytes} bytes in all "
                                "(max_request_bytes, one request's): open another stream", "Validation")

    async def _messages(self, requests: AsyncIterator[bytes], kind: type[M]) -> AsyncIterator[M]:
        """A stream's messages, parsed, held to one HTTP request's limits."""
        n = size = 0
        async for raw in requests:
            n += 1
            size += len(raw)
            self._within_limits(n, size)
            yield _parse(kind, raw)

    # --- the services -----------------------------------------------------------------------------------------
    async def info(self, served: ServedModel, _: pb.InfoRequest) -> pb.InfoResponse:
        if not self.registry.ready:  # as GET /info answers (the other calls meet their engine's own answer)
            raise ApiError(503, "model not loaded", "Unhealthy")
        fields = tei_info(self.registry, served, self.settings)
        model_type = _MODEL_TYPES[next(iter(fields["model_type"]))]
        return pb.InfoResponse(version=self.version, model_id=fields["model_id"], model_sha=fields["model_sha"],
                               model_dtype=fields["model_dtype"], model_type=model_type,
                               max_concurrent_requests=fields["max_concurrent_requests"],
                               max_input_length=fields["max_input_length"],
                               max_batch_tokens=fields["max_batch_tokens"],
                               max_batch_requests=fields["max_batch_requests"],
                               max_client_batch_size=fields["max_client_batch_size"],
                               tokenization_workers=fields["tokenization_workers"])

    async def embed(self, served: ServedModel, r: pb.EmbedRequest) -> bytes:
        return await self._submit(served, r)

    def _submit(self, served: ServedModel, r: pb.EmbedRequest) -> asyncio.Future[bytes]:
        """An Embed message's answer to come (a single call's, or a stream's). It goes to the engine at once where none
        of this process's Embed messages to the model are there (an idle server adds no wait); else it waits with
        the others that come meanwhile, and they go together once what is there is answered (a full batch,
        max_client_batch_size messages, at once): one /embed request per set of options, each answered with its own
        tokens. grpcio starts a process's calls, and reads a stream's messages, a few loop turns apart, so unlike
        HTTP's requests they would never share an engine message: alone, each costs the engine a pass and both
        processes a message."""
        lane = self._lanes.get(id(served))
        if lane is None:
            lane = self._lanes[id(served)] = _Lane()
            served.held += 1  # its calls hold the model as a request inside embed does: a reload retires it after
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        lane.waiting.append((r, time.perf_counter(), future))
        if not lane.in_flight or len(lane.waiting) >= self.max_batch:
            self._send(served, lane)
        return future

    def _send(self, served: ServedModel, lane: _Lane) -> None:
        """The messages that wait, max_client_batch_size at most (what one HTTP request may carry), as a batch."""
        taken, lane.waiting = lane.waiting[:self.max_batch], lane.waiting[self.max_batch:]
        lane.in_flight += 1
        batch = asyncio.ensure_future(self._batch(served, lane, taken))
        self._batches.add(batch)
        batch.add_done_callback(self._batches.discard)

    def _done(self, served: ServedModel, lane: _Lane) -> None:
        """A batch of the lane is answered: those that wait go, once none is left at the engine."""
        lane.in_flight -= 1
        if lane.waiting and not lane.in_flight:
            self._send(served, lane)
        elif not (lane.in_flight or lane.waiting):
            del self._lanes[id(served)]
            served.held -= 1

    async def _batch(self, served: ServedModel, lane: _Lane,
                     taken: list[tuple[pb.EmbedRequest, float, asyncio.Future]]) -> None:
        taken = [call for call in taken if not call[2].done()]  # not the calls whose clients left
        try:
            if taken:
                await self._answer_batch(served, taken)
        except BaseException as e:  # a fault here, or the loop ends: no call waits on for an answer
            for _, _, future in taken:
                if future.done():
                    continue
                if isinstance(e, Exception):
                    future.set_exception(e)
                else:
                    future.cancel()
            raise
        finally:
            self._done(served, lane)

    async def _answer_batch(self, served: ServedModel, taken: list[tuple[pb.EmbedRequest, float, asyncio.Future]]):
        try:
            answers = await self.embed_together(served, [r for r, _, _ in taken], [start for _, start, _ in taken])
        except Exception as e:
            if len(taken) > 1 and to_api_error(e, self.settings.retry_after_s).status == 422:
                # an input is refused: each half answered as a batch of its own, down to the refused call alone,
                # which gets the refusal it would get by itself (never more inputs at the engine than the batch)
                half = len(taken) // 2
                await asyncio.gather(self._answer_batch(served, taken[:half]), self._answer_batch(served, taken[half:]))
                return
            for _, _, future in taken:  # no room, no engine, a refused call: the same answer for all
                if not future.done():
                    future.set_exception(e)
            return
        for (_, _, future), answer in zip(taken, answers, strict=True):
            if not future.done():
                future.set_result(answer)

    async def embed_together(self, served: ServedModel, requests: list[pb.EmbedRequest],
                             starts: list[float] | None = None) -> list[bytes]:
        """Several Embed messages (a batch: single calls' and streams' that waited together), one /embed request for
        each set of options among them. Each answer carries its own message's tokens and characters, its group's
        engine times, and its total time since its start in `starts` (by default, since now)."""
        start = time.perf_counter()
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            normalize = _optional(r, "normalize")
            groups.setdefault((r.truncate, True if normalize is None else normalize,
                               _direction(r.truncation_direction), _optional(r, "prompt_name"),
                               _optional(r, "dimensions")), []).append(i)
        calls = [
            tei.embed_vectors(served, [requests[i].inputs for i in rows], self.max_batch, dimensions=dimensions,
                              normalize=normalize, truncate=truncate, direction=direction, prompt_name=prompt_name)
            for (truncate, normalize, direction, prompt_name, dimensions), rows in groups.items()]
        done = [await calls[0]] if len(calls) == 1 else await asyncio.gather(*calls)  # one: no task for it
        answers: list[bytes] = [b""] * len(requests)
        for rows, (vectors, result) in zip(groups.values(), done):
            tokens = result.row_tokens.tolist() if result.row_tokens is not None else [None] * len(rows)
            for i, vector, count in zip(rows, vectors, tokens):
                metadata = _metadata(len(requests[i].inputs), result, start if starts is None else starts[i], count)
                answers[i] = embed_response(vector, metadata.SerializeToString())
        return answers

    async def embed_sparse(self, served: ServedModel, r: pb.EmbedSparseRequest) -> pb.EmbedSparseResponse:
        start = time.perf_counter()
        vectors, result = await served.embed_sparse([r.inputs], truncate=r.truncate,
                                                    truncation_direction=_direction(r.truncation_direction).lower(),
                                                    prompt_name=_optional(r, "prompt_name"))
        values = [pb.SparseValue(index=i, value=v) for i, v in zip(vectors[0].indices.tolist(),
                                                                   vectors[0].values.tolist())]
        return pb.EmbedSparseResponse(sparse_embeddings=values, metadata=_metadata(len(r.inputs), result, start))

    async def embed_all(self, served: ServedModel, r: pb.EmbedAllRequest) -> pb.EmbedAllResponse:
        start = time.perf_counter()
        states, result = await served.embed_all([r.inputs], truncate=r.truncate,
                                                truncation_direction=_direction(r.truncation_direction).lower(),
                                                prompt_name=_optional(r, "prompt_name"))
        tokens = [pb.TokenEmbedding(embeddings=row) for row in states[0].tolist()]
        return pb.EmbedAllResponse(token_embeddings=tokens, metadata=_metadata(len(r.inputs), result, start))

    async def predict(self, served: ServedModel, r: pb.PredictRequest) -> pb.PredictResponse:
        return await self._predict(served, r.inputs, r)

    async def predict_pair(self, served: ServedModel, r: pb.PredictPairRequest) -> pb.PredictResponse:
        if len(r.inputs) not in (1, 2):  # TEI's words
            raise ApiError(422, f"`inputs` must have a single or two elements. Given: {len(r.inputs)}", "Validation",
                           param="inputs")
        return await self._predict(served, r.inputs[0] if len(r.inputs) == 1 else (r.inputs[0], r.inputs[1]), r)

    async def _predict(self, served: ServedModel, sequence: str | tuple[str, str],
                       r: pb.PredictRequest | pb.PredictPairRequest) -> pb.PredictResponse:
        start = time.perf_counter()
        answers, result = await tei.predictions(served, [sequence], self.max_batch, truncate=r.truncate,
                                                direction=_direction(r.truncation_direction),
                                                raw_scores=r.raw_scores)
        chars = len(sequence) if isinstance(sequence, str) else len(sequence[0]) + len(sequence[1])
        return pb.PredictResponse(predictions=[pb.Prediction(**p) for p in answers[0]],
                                  metadata=_metadata(chars, result, start))

    async def rerank(self, served: ServedModel, r: pb.RerankRequest) -> pb.RerankResponse:
        start = time.perf_counter()
        if not r.texts:  # TEI's words
            raise ApiError(422, "`texts` cannot be empty", "Validation", param="texts")
        texts = list(r.texts)
        scores, result = await tei.rerank_scores(served, r.query, texts, self.max_batch, truncate=r.truncate,
                                                 direction=_direction(r.truncation_direction),
                                                 raw_scores=r.raw_scores)
        chars = len(r.query) * len(texts) + sum(map(len, texts))
        return pb.RerankResponse(ranks=_ranks(scores, texts, r.return_text), metadata=_metadata(chars, result, start))

    async def _rerank_stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Message:
        """(query, text) pairs, one a message, ranked together. Pairs that share a query (and truncation) are
        scored as one /rerank request; raw_scores and return_text are the first message's (as TEI reads them)."""
        route = f"/{PACKAGE}.Rerank/RerankStream"
        with self._counted(route) as counted:
            try:
                return await self._rank_stream(self._model(context, route), requests)
            except Exception as e:
                await self._abort(context, e, counted)
                raise

    async def _rank_stream(self, served: ServedModel, requests: AsyncIterator[bytes]) -> pb.RerankResponse:
        start = time.perf_counter()
        pairs = [r async for r in self._messages(requests, pb.RerankStreamRequest)]
        if not pairs:
            raise ApiError(422, "the stream held no (query, text) pair", "Validation", param="texts")
        groups: dict[tuple[str, bool, str], list[int]] = {}
        for i, r in enumerate(pairs):
            groups.setdefault((r.query, r.truncate, _direction(r.truncation_direction)), []).append(i)
        scored = await asyncio.gather(*(
            tei.rerank_scores(served, query, [pairs[i].text for i in rows], self.max_batch, truncate=truncate,
                              direction=direction, raw_scores=pairs[0].raw_scores)
            for (query, truncate, direction), rows in groups.items()))
        scores = np.empty(len(pairs), dtype=np.float64)
        for rows, (group_scores, _) in zip(groups.values(), scored):
            scores[rows] = group_scores
        results = [result for _, result in scored]
        total = EmbedResult(np.empty((0, 0), np.float32), sum(x.prompt_tokens for x in results),
                            sum(x.queue_s for x in results), sum(x.inference_s for x in results),
                            sum(x.tokenization_s for x in results))
        chars = sum(len(r.query) + len(r.text) for r in pairs)
        return pb.RerankResponse(ranks=_ranks(scores, [r.text for r in pairs], pairs[0].return_text),
                                 metadata=_metadata(chars, total, start))

    async def tokenize(self, served: ServedModel, r: pb.EncodeRequest) -> pb.EncodeResponse:
        tokens = await asyncio.to_thread(served.token_details, [r.inputs], r.add_special_tokens,
                                         _optional(r, "prompt_name"))
        return pb.EncodeResponse(tokens=[pb.SimpleToken(**{k: v for k, v in t.items() if v is not None})
                                         for t in tokens[0]])

    async def decode(self, served: ServedModel, r: pb.DecodeRequest) -> pb.DecodeResponse:
        if not r.ids:
            raise ApiError(422, "ids is empty: give the token ids to decode", "Validation", param="ids")
        texts = await asyncio.to_thread(served.decode, [list(r.ids)], r.skip_special_tokens)
        return pb.DecodeResponse(text=texts[0])


def _ranks(scores: np.ndarray, texts: list[str], return_text: bool) -> list[pb.Rank]:
    order = np.argsort(-scores, kind="stable")
    if return_text:
        return [pb.Rank(index=int(i), score=float(scores[i]), text=texts[i]) for i in order]
    return [pb.Rank(index=int(i), score=float(scores[i])) for i in order]


#: the services of TEI's tei.proto, as health checks and reflection name them
TEI_SERVICES = tuple(service.full_name for service in pb.DESCRIPTOR.services_by_name.values())


class GrpcServer:
    """grpcio's aio server on SEMBED_GRPC_PORT, in this process's event loop. Every API process binds the port
    with SO_REUSEPORT (grpcio's default, set here all the same), so the kernel spreads connections over them as
    it spreads HTTP's over the supervisor's shared socket."""

    def __init__(self, server: grpc.aio.Server, port: int, health_servicer: health.aio.HealthServicer):
        self.server = server
        self.port = port
        self.health = health_servicer
        self._stopping: asyncio.Future | None = None

    @classmethod
    async def start(cls, registry: ModelRegistry, settings: Settings, keys: ApiKeys, version: str) -> GrpcServer:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 1),
                                          ("grpc.max_receive_message_length", settings.max_request_bytes)])
        server.add_generic_rpc_handlers(TeiService(registry, settings, keys, version).handlers())
        # gRPC's standard health service (Kubernetes' grpc probe, grpc_health_probe): SERVING for the server ("")
        # and each TEI service until a drain begins; no key asked, as HTTP's /health asks none. Reflection
        # (grpcurl, Postman) describes the TEI services from the generated code's own descriptor pool.
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        for name in ("", *TEI_SERVICES):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection((*TEI_SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), server,
                                            pool=pb.DESCRIPTOR.pool)
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        try:
            port = server.add_insecure_port(f"{host}:{settings.grpc_port}")
        except RuntimeError as e:
            raise RuntimeError(f"gRPC could not listen on {host}:{settings.grpc_port} (SEMBED_GRPC_PORT): in use by "
                               "another program?") from e
        await server.start()
        log.info("TEI's gRPC API on %s:%d", host, port)
        return cls(server, port, health_servicer)

    def begin_stop(self, grace_s: float) -> None:
        """Take no new calls from now on; those in flight get `grace_s` to finish (HTTP drains beside it)."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._drain(grace_s))

    async def _drain(self, grace_s: float) -> None:
        await self.health.enter_graceful_shutdown()  # NOT_SERVING for every service: probes stop routing here
        await self.server.stop(grace_s)

    async def stop(self, grace_s: float) -> None:
        self.begin_stop(grace_s)
        assert self._stopping is not None
        await self._stopping
