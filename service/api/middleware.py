"""The guard in front of every route (plain ASGI: a BaseHTTPMiddleware would cost a task per request).

- a request id (a client's `X-Request-ID` if sane, else a new one), returned in the response;
- bodies are JSON, labelled so: a form or text/plain label is what a web page can send to a
  service on the user's machine without a CORS preflight, so it gets 415 (curl users: `--json`);
- the body is read here under a byte limit (413 before anything is parsed) and a deadline (408
  for a client that never finishes sending);
- a client that disconnects cancels its request, which drops its rows from the queue;
- API keys, when set (service/auth.py);
- `/models/{name}/<route>` is `<route>` on model {name}: TEI's clients name no model in their calls, only a URL
  (an unknown name is a 404 that lists the served ones);
- every request is counted by route and status (499: the client left) and logged as one JSON line;
- POST /embed and /v1/embeddings, the routes a client calls per text, skip FastAPI's stack when their
  body is valid (`lean`): pydantic's own JSON parser fills the route's body model and the route runs
  with the app's error handler. A body it refuses goes the whole FastAPI way, so every error answer
  is FastAPI's own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from urllib.parse import unquote

import orjson
from fastapi import Request
from pydantic import ValidationError
from starlette.routing import Match

from service.api.auth import ApiKeys
from service.api.errors import ApiError, error_body, protocol_of
from service.api.protocol import ON_CLIENT_LEFT
from service.metrics import ApiMetrics

access = logging.getLogger("sembed.access")

_BODY_METHODS = {"POST", "PUT", "PATCH"}
_JSON = re.compile(rb"^application/([a-z0-9.+-]*\+)?json\s*(;.*)?$", re.IGNORECASE)
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
CLIENT_CLOSED = 499
MODEL_PREFIX = "/models/"
_CLIENT_LEFT = ApiError(CLIENT_CLOSED, "the client left while sending its body", "Validation")


class RequestGuard:
    def __init__(self, app, *, metrics: ApiMetrics, router, max_body_bytes: int, body_timeout_s: float,
                 keys: ApiKeys | None = None, access_log: bool = False, lean_paths: tuple[str, ...] = (),
                 error_handler=None):
        self.app = app
        self.keys = keys or ApiKeys([])
        self.access_log = access_log
        self.metrics = metrics
        self.router = router
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.error_handler = error_handler
        # path → (route, its body model, its endpoint `async def f(req, request)`)
        self.lean = {r.path: (r, r.dependant.body_params[0].field_info.annotation, r.dependant.call)
                     for r in _flatten(router.routes) if r.path in lean_paths and "POST" in r.methods}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        headers = dict(scope["headers"])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.match(given) else os.urandom(16).hex()  # uuid4's length, a tenth the cost
        scope.setdefault("state", {})["request_id"] = request_id
        status = CLIENT_CLOSED

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            if scope["path"].startswith(MODEL_PREFIX):
                unknown = self._take_model_prefix(scope)
                if unknown is not None:
                    await self._reply(scope, send_with_id, unknown, request_id)
                    return
            refused = self.keys.check(scope["path"], headers.get(b"authorization"))
            if refused is not None:
                await self._reply(scope, send_with_id, refused, request_id)
                return
            body = b""
            if scope["method"] in _BODY_METHODS:
                problem = self._check_headers(headers)
                if problem is None:
                    body, problem = await self._read_body(receive)
                if problem is not None:
                    if problem is not _CLIENT_LEFT:  # nobody to answer
                        await self._reply(scope, send_with_id, problem, request_id)
                    return
            lean = self.lean.get(scope["path"]) if body and not scope.get("root_path") else None
            app = self.app
            if lean is not None and scope["method"] == "POST":
                route, model, endpoint = lean
                try:
                    req = model.model_validate_json(body)
                except ValidationError:
                    pass  # FastAPI's route answers it, in its own words
                else:
                    app = self._lean_app(route, req, endpoint)
            await self._run_app(scope, receive, send_with_id, body, app)
        finally:
            route = self._route_path(scope)
            seconds = time.perf_counter() - start
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.request_seconds.labels(route).observe(seconds)
            if self.access_log:
                client = scope.get("client") or ("", 0)
                access.info(orjson.dumps({"request_id": request_id, "method": scope["method"], "path": scope["path"],
                                          "route": route, "status": status, "ms": round(seconds * 1000, 3),
                                          "client": client[0]}).decode())

    def _take_model_prefix(self, scope) -> ApiError | None:
        """/models/{name}/<route> → <route> (/models/{name} → /), with {name} in the request's state for the routes'
        model lookup."""
        raw = scope.get("raw_path") or scope["path"].encode()
        name, _, rest = raw[len(MODEL_PREFIX):].partition(b"/")
        if not name:
            return None
        model = unquote(name.decode("latin-1"))
        registry = getattr(scope["app"].state, "registry", None)
        if registry is not None and model not in registry.names():
            return ApiError(404, f"no model named {model!r} in the URL; this service has {registry.names()}",
                            "NotFound", param="model")
        scope["state"]["model"] = model
        scope["path"] = "/" + unquote(rest.decode("latin-1"))
        scope["raw_path"] = b"/" + rest
        return None

    def _check_headers(self, headers: dict[bytes, bytes]) -> ApiError | None:
        length = headers.get(b"content-length")
        has_body = b"transfer-encoding" in headers or (length is not None and length.strip() != b"0")
        if not has_body:
            return None
        ctype = headers.get(b"content-type")
        if ctype is None or not _JSON.match(ctype.strip()):
            label = ctype.decode("latin-1") if ctype else "none"
            return ApiError(415, f"request bodies must be JSON with Content-Type: application/json (got {label}); "
                                 "with curl use --json '{...}' or -H 'Content-Type: application/json'", "Validation")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                return ApiError(400, "Content-Length is not a number", "Validation")
            if size > self.max_body_bytes:
                return self._too_large(size)
        return None

    def _too_large(self, size: int | None) -> ApiError:
        got = f"{size} bytes" if size is not None else "more"
        return ApiError(413, f"request body of {got} is over the limit of {self.max_body_bytes} bytes: "
                             "split the request", "Validation")

    async def _read_body(self, receive) -> tuple[bytes, ApiError | None]:
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.body_timeout_s):  # one timer for the whole body, no task per read
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return b"", _CLIENT_LEFT
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        return b"", self._too_large(None)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks), None
        except TimeoutError:
            return b"", ApiError(408, f"the request body did not arrive within {self.body_timeout_s:g} s",
                                 "Validation", headers={"Connection": "close"})

    def _lean_app(self, route, req, endpoint):
        async def app(scope, receive, send):
            scope["route"] = route  # what the metrics and the error body name
            request = Request(scope, receive, send)
            try:
                response = await endpoint(req, request)
            except Exception as exc:
                response = await self.error_handler(request, exc)
            await response(scope, receive, send)
        return app

    async def _run_app(self, scope, receive, send, body: bytes, app) -> None:
        """Run the route in this task, cancelling it if the client disconnects before the answer is sent: the
        protocol calls the hook left here in the scope (service/api/protocol.py), no task per request."""
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # the body is read: what comes next is the disconnect

        current = asyncio.current_task()
        if current is None:
            raise RuntimeError("the guard runs the route in the request's task: there is none")
        left = False

        def on_client_left() -> None:
            nonlocal left
            if not left:
                left = True
                current.cancel()

        state = scope.setdefault("state", {})
        state[ON_CLIENT_LEFT] = on_client_left
        try:
            await app(scope, replay, send)
        except asyncio.CancelledError:
            # the client left (our cancel, the only one pending): the request ends here, counted 499
            if not left or current.uncancel() > 0:
                raise
        finally:
            state.pop(ON_CLIENT_LEFT, None)

    async def _reply(self, scope, send, error: ApiError, request_id: str) -> None:
        route = self._route(scope)
        self.metrics.request_errors.labels(route.path if route else "unmatched", error.error_type).inc()
        content = orjson.dumps(error_body(protocol_of(route), error, request_id))
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def _route_path(self, scope) -> str:
        route = self._route(scope)
        return route.path if route is not None else "unmatched"

    def _route(self, scope):
        route = scope.get("route")
        if route is not None:
            return route
        for candidate in _flatten(self.router.routes):  # rejected before routing: the route it was for
            match, _ = candidate.matches(scope)
            if match != Match.NONE:
                return candidate
        return None


def _flatten(routes):
    for route in routes:
        inner = getattr(route, "original_router", None)  # FastAPI keeps included routers whole
        if inner is not None:
            yield from _flatten(inner.routes)
        elif hasattr(route, "path"):
            yield route
