"""The hot routes: a lean handler for routes whose inputs are one JSON body model and the Request,
and HotRoutes, which calls it without going through Starlette's middleware stack and router.

FastAPI's generic handler parses the content type with `email.message`, solves a dependency graph
and fills telemetry records on every request; for `async def route(req: Model, request: Request)`
all that yields is `Model.model_validate(json.loads(body))`. JsonBodyRoute does just that (the
same parser and validation, so the same answers), and leaves every other route, and every request
while FastAPI's OpenTelemetry is on, to FastAPI's own handler. The body's content type was already
checked by the guard (415 otherwise). The OpenAPI document is FastAPI's: the route is an APIRoute.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.telemetry import get_telemetry_data
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from service.api.errors import ApiError


class JsonBodyRoute(APIRoute):
    #: the lean handler, when this route has the shape for it (HotRoutes calls it directly)
    direct: Callable[[Request], Awaitable[Response]] | None = None

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        generic = super().get_route_handler()
        d = self.dependant
        body = d.body_params[0] if len(d.body_params) == 1 else None
        model = body.field_info.annotation if body is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel) and d.request_param_name
                and inspect.iscoroutinefunction(d.call) and not getattr(body.field_info, "embed", False)
                and not (d.path_params or d.query_params or d.header_params or d.cookie_params or d.dependencies)):
            return generic
        endpoint, names = d.call, (body.name, d.request_param_name)

        async def handler(request: Request) -> Response:
            if get_telemetry_data() is not None:  # FastAPI's spans want its own steps
                return await generic(request)
            req = _validate(model, await request.body())
            response = await endpoint(**dict(zip(names, (req, request))))
            if not isinstance(response, Response):  # our routes answer JSON(...): no response_model pass
                raise TypeError(f"{self.path} returned {type(response).__name__}, not a Response")
            return response

        self.direct = handler
        return handler


class HotRoutes:
    """Calls the lean handler of a JsonBodyRoute with a fixed path straight from the guard, past
    Starlette's middleware stack and router: they run on the event loop, which on a small CPU shares
    the cores with onnxruntime, so under many one-text requests their time comes out of inference.
    Errors get the app's own answer (`answer_error`); other requests, and all while OpenTelemetry
    is on, go on to `app`."""

    def __init__(self, app, *, routes: list[APIRoute],
                 answer_error: Callable[[Request, Exception], Awaitable[Response]], enabled: bool = True):
        self.app = app
        self.answer_error = answer_error
        self.table = {(method, r.path): r for r in routes if isinstance(r, JsonBodyRoute) and r.direct is not None
                      for method in r.methods} if enabled else {}

    async def __call__(self, scope, receive, send) -> None:
        route = self.table.get((scope.get("method"), scope.get("path"))) if scope["type"] == "http" else None
        if route is None or scope.get("root_path"):  # a prefix to strip: the router knows how
            return await self.app(scope, receive, send)
        scope["route"] = route  # what the metrics and the error body name
        request = Request(scope, receive, send)
        try:
            response = await route.direct(request)
        except Exception as exc:
            response = await self.answer_error(request, exc)
        await response(scope, receive, send)


def parse_json(raw: bytes) -> Any:
    """The body as JSON, or a 422 saying where it is not."""
    if not raw:
        raise ApiError(422, "the request has no body: send a JSON object", "Validation", param="body")
    try:  # the stdlib parser, as FastAPI's: a lone surrogate reaches the engine's Unicode check by index
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ApiError(422, f"the body is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})",
                       "Validation", param="body") from None
    except UnicodeDecodeError as e:
        raise ApiError(422, f"the body is not UTF-8 JSON: {e.reason} (byte {e.start})", "Validation",
                       param="body") from None


def _validate(model: type[BaseModel], raw: bytes) -> BaseModel:
    data = parse_json(raw)
    try:
        return model.model_validate(data, from_attributes=True)  # as FastAPI does: the same messages
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)],
                                     body=data) from None
