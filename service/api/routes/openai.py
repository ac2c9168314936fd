"""The OpenAI embeddings API: POST /v1/embeddings and GET /v1/models, with OpenAI's error body.

`input` may be token ids, as OpenAI allows; here they are the served model's own tokenizer's ids
(what /tokenize returns), taken as they are: special tokens included if the client put them in, and no
prompt. `prompt_name` and `instruction` (ours: the openai client sends them with `extra_body`) put a
prompt before each text, as TEI's /embed does. `embedding_type` (ours, also with extra_body) gives int8, uint8,
binary or ubinary vectors as sentence-transformers' quantize_embeddings does (service/api/output_types.py); with
`encoding_format` base64, a row's bytes.
"""

from __future__ import annotations

import time
from typing import cast

from fastapi import APIRouter, Request

from service.api import chunking as chunks
from service.api import output_types, schemas
from service.api.errors import OPENAI_TAG, ApiError
from service.api.output_types import base64_rows
from service.api.routes.common import NumpyJSONResponse, check_batch, matryoshka, model, registry, timing_headers

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
    served = model(request, req.model)
    if req.embedding_type != "float":  # refused before any compute where the model cannot give it
        output_types.require(req.embedding_type, served.info, req.dimensions)
    spans = None
    if req.chunking not in (None, False):  # ours: a row per chunk, with its input's index and its span
        if not isinstance(texts[0], str):
            raise ApiError(400, "'$.chunking' applies to text: inputs given as token ids are not cut", "Validation",
                           param="chunking")
        spans, texts = await chunks.cut(served, cast(list[str], texts), req.chunking, request.app.state.settings,
                                        "input", req.prompt_name, req.instruction)
    result = await served.embed(texts, normalize=True, prompt_name=req.prompt_name, instruction=req.instruction)
    vectors = output_types.convert(matryoshka(result.vectors, req.dimensions, normalize=True), req.embedding_type,
                                   served.info.manifest)
    if req.encoding_format == "base64":
        rows = base64_rows(vectors)
    else:
        rows = list(vectors)
    if spans is None:
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    else:
        owned = [(i, a, b) for i, found in enumerate(spans) for a, b in found]
        data = [{"object": "embedding", "index": i, "embedding": row, "start": a, "end": b}
                for (i, a, b), row in zip(owned, rows)]
    body = {"object": "list", "data": data, "model": registry(request).name_of(served),
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}}
    return NumpyJSONResponse(body, headers=timing_headers(result, time.perf_counter() - start))


@router.get("/models")
async def models(request: Request):
    reg = registry(request)
    return {"object": "list",
            "data": [{"id": name, "object": "model", "created": 0, "owned_by": "sembed"} for name in reg.names()]}
