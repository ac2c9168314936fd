"""The framework's floor for `make bench-frontend`: one bare FastAPI route on the service's own stack (uvicorn
with httptools and uvloop, a pydantic body, orjson), answering a single-text embed with a constant vector.

What it costs per request on a machine is what any FastAPI service pays there before doing anything of its
own: the bench prints it beside the service's figure, so a per-request target can be read against it.

    python -m uvicorn benchmarks.floor_app:app --port 8000
"""

from __future__ import annotations

import numpy as np
import orjson
from fastapi import FastAPI, Response
from pydantic import BaseModel

DIMENSION = 384  # the default model's; the cost of encoding it is part of the floor

app = FastAPI()
_VECTOR = np.full((1, DIMENSION), DIMENSION ** -0.5, dtype=np.float32)


class EmbedRequest(BaseModel):
    inputs: str | list[str]


@app.post("/embed")
async def embed(request: EmbedRequest) -> Response:
    return Response(orjson.dumps(_VECTOR, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


@app.get("/readyz")
async def readyz() -> Response:
    return Response(b"ok")
