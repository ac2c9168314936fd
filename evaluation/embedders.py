"""What the harness evaluates: anything with `encode(texts) -> [n, dim]` float32 array.

Three kinds: the running service over HTTP, an ONNX export in process, a HF/sentence-transformers
directory in process (torch). `load_embedder` picks one from `--url` / `--model`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Embedder(Protocol):
    name: str

    def encode(self, texts: list[str]) -> np.ndarray: ...


class ServiceError(RuntimeError):
    pass


class HttpClient:
    """A small client for the service: chunked requests, retries on connection errors and 503."""

    def __init__(self, url: str, chunk: int = 128, timeout: float = 120.0, retries: int = 5):
        import httpx

        self.url = url.rstrip("/")
        self.chunk = chunk
        self.retries = retries
        self._http = httpx.Client(base_url=self.url, timeout=timeout)

    def request(self, method: str, path: str, json: Any = None) -> Any:
        import httpx

        for attempt in range(self.retries + 1):
            try:
                r = self._http.request(method, path, json=json)
            except httpx.TransportError as e:
                if attempt == self.retries:
                    raise ServiceError(f"cannot reach {self.url}{path}: {e}") from e
            else:
                if r.status_code == 503 and attempt < self.retries:
                    pass  # queue full: back off and retry
                elif r.is_success:
                    return r.json()
                else:
                    raise ServiceError(f"{method} {path} → HTTP {r.status_code}: {r.text[:500]}")
            time.sleep(min(2**attempt * 0.25, 5))
        raise AssertionError("unreachable")

    def chunks(self, items: list) -> list[list]:
        return [items[i : i + self.chunk] for i in range(0, len(items), self.chunk)]


class ServiceEmbedder:
    def __init__(self, url: str, chunk: int = 128):
        self.client = HttpClient(url, chunk)
        self.name = self.client.request("GET", "/info")["manifest"]["name"]

    def encode(self, texts: list[str]) -> np.ndarray:
        rows = [self.client.request("POST", "/embed", {"inputs": part})["embeddings"]
                for part in self.client.chunks(list(texts))]
        return np.asarray([r for part in rows for r in part], dtype=np.float32).reshape(len(texts), -1)


class OnnxEmbedder:
    def __init__(self, export_dir: str | Path):
        from service.encoder import OnnxEncoder

        self.encoder = OnnxEncoder(export_dir)
        self.name = self.encoder.manifest.name

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.encoder.encode(list(texts))


class TorchEmbedder:
    def __init__(self, model_dir: str | Path):
        from training.encoder import SentenceEncoder

        self.encoder = SentenceEncoder.from_pretrained(model_dir)
        self.name = Path(model_dir).name

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.encoder.encode(list(texts))


def load_embedder(url: str | None = None, model: str | Path | None = None) -> Embedder:
    """`url` → the running service; `model` → an export dir (has manifest.json) or a HF/ST dir."""
    if (url is None) == (model is None):
        raise ValueError("give exactly one of --url or --model")
    if url is not None:
        return ServiceEmbedder(url)
    path = Path(model)
    if (path / "manifest.json").is_file():
        return OnnxEmbedder(path)
    if (path / "config.json").is_file():
        return TorchEmbedder(path)
    raise ValueError(f"{model} is neither an export directory (manifest.json) nor a HF model (config.json)")
