"""Errors as HTTP answers: one status per kind of failure, one body shape per API family.

Native (TEI-compatible) routes answer `{"error": msg, "error_type": kind}` as TEI does; the OpenAI
routes (their router's tag says so, not their URL) answer `{"error": {"message", "type", "param",
"code"}}` as OpenAI's clients expect, Cohere's `{"message": msg}`. Server-side failures carry the
request id, so a user's report can be found in the logs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.registry import ModelNotFound
from service.index import VectorIndexError
from service.ipc import messages as engine


@dataclass
class ApiError(Exception):
    status: int
    message: str
    error_type: str  # TEI's kinds: Validation, Overloaded, Unhealthy, Backend, Tokenizer; and NotFound, ...
    param: str | None = None
    detail: Any = None
    headers: dict[str, str] = field(default_factory=dict)


# status, TEI error_type, OpenAI error type
_ENGINE_ERRORS: list[tuple[type[Exception], int, str]] = [
    (ModelNotFound, 404, "NotFound"),
    (engine.InputTooLong, 422, "Validation"),
    (engine.InvalidInput, 422, "Validation"),
    (engine.Overloaded, 429, "Overloaded"),
    (engine.NotReady, 503, "Unhealthy"),  # EngineUnavailable too: the engine process died
    (engine.QueueDeadline, 503, "Overloaded"),
    (engine.InferenceFailed, 424, "Backend"),
    (engine.WrongModelType, 424, "Backend"),  # as TEI answers /embed on a reranker and /rerank on an embedder
]
_OPENAI_TYPES = {"Overloaded": "rate_limit_error", "Unhealthy": "server_error", "Backend": "server_error",
                 "Internal": "server_error"}  # the rest: invalid_request_error
_OPENAI_CODES = {"Unauthorized": "invalid_api_key", "NotFound": "model_not_found",
                 "Overloaded": "rate_limit_exceeded", "Validation": "invalid_request"}


_STATUS_MEANINGS = {400: "the body could not be read", 401: "no or wrong API key", 403: "admin routes closed",
                    404: "no such model, collection, document or route", 408: "headers or body too slow",
                    409: "collection exists, is being rebuilt, or was embedded by another model",
                    413: "body over max_request_bytes", 415: "body not labelled JSON", 422: "invalid request",
                    424: "the model failed on an input, or is of the wrong type for the route (a reranker "
                         "gives no embeddings)", 429: "no free permit: retry after Retry-After",
                    503: "not ready, shutting down, queued past the deadline, or the index log unavailable",
                    507: "the index volume is full: the write was not applied"}
#: every route may answer these (documented once, on the app: the guard applies them everywhere)
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"description": text, "content": {"application/json": {"schema": {"type": "object"}}}}
    for code, text in _STATUS_MEANINGS.items()}


_UNION_TAG = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|function-.*)$")


def to_api_error(exc: Exception, retry_after_s: int = 1) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    for kind, status, error_type in _ENGINE_ERRORS:
        if isinstance(exc, kind):
            # a 429 says when admission expects room: the engine's estimate, whole seconds as the header wants
            wait = getattr(exc, "retry_after_s", None) if status == 429 else None
            retry = str(max(1, round(wait)) if wait else retry_after_s)
            headers = {"Retry-After": retry} if status in (429, 503) else {}
            # a refused prompt names its field, and an unknown name lists the model's (PromptRefused)
            return ApiError(status, str(exc), error_type, param=getattr(exc, "param", None),
                            detail=getattr(exc, "detail", None), headers=headers)
    if isinstance(exc, VectorIndexError):
        headers = {"Retry-After": str(retry_after_s)} if exc.status == 503 else {}
        return ApiError(exc.status, str(exc), exc.error_type, headers=headers)
    if isinstance(exc, RequestValidationError):
        detail = [{k: e[k] for k in ("loc", "msg", "type")} for e in exc.errors()]
        # Of a union's failures (`str | list[str]`), the one that is not a mere type mismatch says most.
        first = next((e for e in detail if not e["type"].endswith("_type")), detail[0] if detail else
                     {"loc": (), "msg": "invalid request"})
        if first["type"] == "json_invalid":  # FastAPI's parser: loc is ("body", character offset)
            return ApiError(422, f"the body is not valid JSON: {first['msg']} at character {first['loc'][-1]}",
                            "Validation", param="body")
        where = ".".join(str(p) for p in first["loc"] if p != "body" and not _UNION_TAG.match(str(p))) or "body"
        return ApiError(422, f"invalid request: {where}: {first['msg']}", "Validation", param=where,
                        detail=jsonable_encoder(detail))
    if isinstance(exc, StarletteHTTPException):
        error_type = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "Validation")
        message = str(exc.detail)
        if exc.status_code == 400 and message == "There was an error parsing the body":  # FastAPI's, and vague
            message = "the body could not be parsed as JSON (not UTF-8, nested too deeply, or a number too large)"
        return ApiError(exc.status_code, message, error_type, headers=dict(exc.headers or {}))
    return ApiError(500, f"internal error ({type(exc).__name__})", "Internal")


#: the router tag of the OpenAI-compatible routes: their errors take OpenAI's body
OPENAI_TAG = "openai"
#: ... and of Cohere's: `{"message": ...}`, as Cohere's API and its SDK's errors carry it
COHERE_TAG = "cohere"


def protocol_of(route) -> str:
    """The API family a route belongs to, by its router's tag: "openai", "cohere", or "native" (TEI's shape, and
    ours)."""
    tags = getattr(route, "tags", ()) if route is not None else ()
    return next((tag for tag in (OPENAI_TAG, COHERE_TAG) if tag in tags), "native")


def error_body(protocol: str, error: ApiError, request_id: str | None) -> dict[str, Any]:
    """The body for `error` in the shape of the route's API family (`protocol_of`)."""
    server_side = error.status >= 500 or error.status == 424
    body: dict[str, Any]
    if protocol == COHERE_TAG:
        return {"message": error.message, **({"request_id": request_id} if server_side else {})}
    if protocol == OPENAI_TAG:
        body = {"message": error.message, "type": _OPENAI_TYPES.get(error.error_type, "invalid_request_error"),
                "param": error.param, "code": _OPENAI_CODES.get(error.error_type, error.error_type.lower())}
        if server_side:
            body["request_id"] = request_id
        return {"error": body}
    body = {"error": error.message, "error_type": error.error_type}
    if error.detail is not None:
        body["detail"] = error.detail
    if server_side:
        body["request_id"] = request_id
    return body
