"""What the routers share: the registry lookup, the fast JSON response, TEI's timing headers."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
from fastapi import Request
from fastapi.responses import Response

from service.api.errors import ApiError
from service.api.registry import ModelRegistry, ServedModel
from service.ipc.messages import EmbedResult
from service.settings import Settings


class NumpyJSONResponse(Response):
    """orjson writes float32 arrays directly: no list of Python floats, no pydantic pass over them."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY, default=_contiguous)


def _contiguous(value: Any) -> Any:
    """orjson writes only C-contiguous arrays; a column slice (`dimensions`) is copied first."""
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value)
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def read_json(raw: bytes) -> Any:
    """A body as JSON for the routes that read it themselves, with FastAPI's own answers: 422 saying where
    it is not JSON, 400 for what no parser should take (nesting past the recursion limit, an integer of
    thousands of digits)."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ApiError(422, f"the body is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})",
                       "Validation", param="body") from None
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, f"the body could not be parsed: {type(e).__name__}", "Validation", param="body") from None


def registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


def settings(request: Request) -> Settings:
    return request.app.state.settings


def model(request: Request, name: str | None = None) -> ServedModel:
    """The model a request names: in its body (`name`), in its URL (/models/{name}/..., RequestGuard), or the
    default. Body and URL naming two models is a 422, not a guess."""
    reg = registry(request)
    in_url = request.scope.get("state", {}).get("model")
    if in_url is None:
        return reg.get(name)
    served = reg.get(in_url)
    if name is not None and name != in_url and reg.get(name) is not served:
        raise ApiError(422, f"the URL names model {in_url!r} and the body {name!r}: name one, or the same one twice",
                       "Validation", param="model")
    return served


def check_batch(request: Request, n: int, field: str) -> None:
    check_count(n, settings(request).max_client_batch_size, field)


def check_count(n: int, limit: int, field: str) -> None:
    """`n` inputs in one request (or gRPC stream) against max_client_batch_size."""
    if n > limit:
        raise ApiError(422, f"{n} {field} in one request; the limit (max_client_batch_size) is {limit}: "
                            "split the request", "Validation", param=field)


def timing_headers(result: EmbedResult, total_s: float | None = None) -> dict[str, str]:
    """TEI's headers, in milliseconds (x-compute-time is the time spent inside the engine)."""
    compute = result.tokenization_s + result.queue_s + result.inference_s
    headers = {
        "x-compute-time": f"{compute * 1000:.3f}",
        "x-compute-tokens": str(result.prompt_tokens),
        "x-tokenization-time": f"{result.tokenization_s * 1000:.3f}",
        "x-queue-time": f"{result.queue_s * 1000:.3f}",
        "x-inference-time": f"{result.inference_s * 1000:.3f}",
    }
    if total_s is not None:
        headers["x-total-time"] = f"{total_s * 1000:.3f}"
    return headers


def matryoshka(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """The first `dimensions` components, renormalised (Matryoshka-trained models keep their meaning)."""
    dim = vectors.shape[1]
    if dimensions is None or dimensions == dim:
        return vectors
    if dimensions > dim:
        raise ApiError(422, f"dimensions={dimensions} exceeds the model's {dim}", "Validation", param="dimensions")
    cut = vectors[:, :dimensions]
    return cut / np.linalg.norm(cut, axis=1, keepdims=True).clip(min=1e-12) if normalize else cut
