"""sentence-transformers behind HTTP as a user writes it: one FastAPI endpoint that encodes each request's
texts with `SentenceTransformer.encode`, under uvicorn's defaults (one process).

The endpoint is a plain `def`, so FastAPI runs each request in its thread pool and requests overlap in torch,
which spreads each encode over the cores itself; no batching across requests. The body and the answer are
OpenAI's embeddings shape (POST /v1/embeddings), as Infinity's and ours are in `make bench-peers`.
Runs in the peers' environment (.venv/peers):

    PEERS_ST_MODEL=<sentence-transformers dir> .venv/peers/bin/python -m uvicorn benchmarks.peers_st_server:app
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(os.environ["PEERS_ST_MODEL"], device="cpu")
app = FastAPI()


class EmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str | None = None


@app.post("/v1/embeddings")
def embeddings(req: EmbeddingRequest) -> dict:
    texts = [req.input] if isinstance(req.input, str) else req.input
    vectors = model.encode(texts, normalize_embeddings=True)
    return {"object": "list", "model": req.model or "all-MiniLM-L6-v2",
            "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]}
