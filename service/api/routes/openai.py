"""The OpenAI embeddings API: POST /v1/embeddings and GET /v1/models, with OpenAI's error body.

`input` may be token ids, as OpenAI allows; here they are the served model's own tokenizer's ids
(what /tokenize returns), taken as they are: special tokens included if the client put them in, and no
prompt. `prompt_name` and `instruction` (ours: the openai client sends them with `extra_body`) put a
prompt before each text, as TEI's /embed does.
"""

from __future__ import annotations

import time
from typing import cast

import numpy as np
import pybase64
from fastapi import APIRouter, Request

from service.api import schemas
from service.api.errors import OPENAI_TAG, ApiError
from service.api.routes.common import NumpyJSONResponse, check_batch, matryoshka, registry, timing_headers

router = APIRouter(prefix="/v1", tags=[OPENAI_TAG])


@router.post("/embeddings", response_model=schemas.OpenAIEmbeddingResponse)
async def embeddings(req: schemas.OpenAIEmbeddingRequest, request: Request):
    start = time.perf_counter()
    one = isinstance(req.input, str) or isinstance(req.input[0], int)  # one text, or one input as token ids
    # pydantic's lists hold one kind: texts, or token-id inputs
    texts = cast(list[str] | list[list[int]], [req.input] if one else req.input)
    check_batch(request, len(texts), "input")
    if any(isinstance(t, str) and not t for t in texts):  # OpenAI answers an empty string with 400
        raise ApiError(400, "'$.input' is invalid: an input is an empty string", "Validation", param="input")
    served = registry(request).get(req.model)
    result = await served.embed(texts, normalize=True, prompt_name=req.prompt_name, instruction=req.instruction)
    vectors = matryoshka(result.vectors, req.dimensions, normalize=True)
    if req.encoding_format == "base64":
        rows = base64_rows(vectors)
    else:
        rows = list(vectors)
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    body = {"object": "list", "data": data, "model": registry(request).name_of(served),
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}}
    return NumpyJSONResponse(body, headers=timing_headers(result, time.perf_counter() - start))


def base64_rows(vectors: np.ndarray) -> list[str]:
    """Each row as little-endian float32 bytes in base64, as OpenAI sends it. A row of a multiple of 3 bytes
    is a whole number of base64 chunks, so the matrix is encoded once and cut (one call, not one per row)."""
    matrix = np.ascontiguousarray(vectors, dtype="<f4")
    row_bytes = matrix.shape[1] * 4
    if row_bytes % 3:
        return [pybase64.b64encode_as_string(row.tobytes()) for row in matrix]
    text = pybase64.b64encode_as_string(matrix.tobytes())
    width = row_bytes // 3 * 4
    return [text[i:i + width] for i in range(0, len(text), width)]


@router.get("/models")
async def models(request: Request):
    reg = registry(request)
    return {"object": "list",
            "data": [{"id": name, "object": "model", "created": 0, "owned_by": "sembed"} for name in reg.names()]}
