"""What the harness evaluates: anything with `encode(texts) -> float32 array [n, dim]`.

Three implementations, picked by `load_embedder(url=..., model=...)`:
- `ServiceEmbedder`: the running service, POST /embed, chunked to the service's request limit;
- `OnnxEmbedder`: an export directory (manifest.json + model.onnx) in process, the service's own encoder;
- `TorchEmbedder`: a HF / sentence-transformers directory in process (core.encoder.SentenceEncoder).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

#: the service refuses requests with more texts than this (HTTP 422); /info announces its own limits
SERVICE_MAX_INPUTS = 256
SERVICE_MAX_BYTES = 2_000_000
#: characters kept per text: far beyond any model's max_seq_length tokens, so the embedding is unchanged,
#: but a book-length document cannot push a request over the service's body limit
MAX_TEXT_CHARS = 20_000


@runtime_checkable
class Embedder(Protocol):
    name: str

    def encode(self, texts: list[str]) -> np.ndarray: ...


class ServiceError(RuntimeError):
    """The service answered with an error, or could not be reached after the retries."""


class HttpClient:
    """The service's REST API: JSON in and out, retried on connection errors, 429 (busy) and 503.

    Other errors fail at once with the status and the service's error body: a 4xx means the request
    itself is wrong (too many texts, a text too long, a bad field) and retrying cannot help.
    """

    def __init__(self, url: str, chunk: int = 128, timeout: float = 300.0, retries: int = 5, backoff: float = 0.5):
        import httpx

        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        self._info: dict | None = None
        self._chunk = chunk

    def request(self, method: str, path: str, json: Any = None) -> Any:
        import httpx

        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                r = self._http.request(method, path, json=json)
            except httpx.TransportError as e:  # refused, reset, timed out: the service may be restarting
                if last:
                    raise ServiceError(f"cannot reach {self.url}{path} ({type(e).__name__}: {e})") from e
            else:
                if r.is_success:
                    return r.json()
                if r.status_code not in (429, 503) or last:
                    raise ServiceError(f"{method} {self.url}{path} → HTTP {r.status_code}: {r.text[:500]}")
                retry_after = r.headers.get("retry-after", "")
                if retry_after.isdigit():
                    time.sleep(min(float(retry_after), 30.0))
                    continue
            time.sleep(min(self.backoff * 2**attempt, 8.0))
        raise AssertionError("unreachable")

    def info(self) -> dict:
        """GET /info (manifest, index size, limits), fetched once; {} if the service has no /info."""
        if self._info is None:
            try:
                self._info = self.request("GET", "/info")
            except ServiceError as e:
                if "HTTP 404" not in str(e):
                    raise
                self._info = {}
        return self._info

    def limits(self) -> dict:
        return self.info().get("limits", {})

    def model_name(self) -> str:
        return self.info().get("manifest", {}).get("name") or self.url

    @property
    def chunk(self) -> int:
        """Texts per request: as asked, but never more than the service accepts."""
        return min(self._chunk, self.limits().get("max_client_batch_size", SERVICE_MAX_INPUTS))

    def chunks(self, items: list) -> list[list]:
        """Consecutive parts of at most `chunk` items whose JSON stays well under the body limit."""
        budget = int(self.limits().get("max_request_bytes", SERVICE_MAX_BYTES) * 0.8)
        parts: list[list] = [[]]
        size = 0
        for item in items:
            n = len(json.dumps(item).encode())
            if parts[-1] and (len(parts[-1]) == self.chunk or size + n > budget):
                parts.append([])
                size = 0
            parts[-1].append(item)
            size += n
        return parts if parts[0] else []


class ServiceEmbedder:
    """Embeds through POST /embed with normalize=true, `chunk` texts per request (≤ the service's limit)."""

    def __init__(self, url: str, chunk: int = 128):
        self.client = HttpClient(url, chunk)
        self.name = self.client.model_name()

    def encode(self, texts: list[str]) -> np.ndarray:
        texts = list(texts)
        # Requests of similar lengths pad less inside the service's batches; rows go back in order.
        order = np.argsort([-len(t) for t in texts], kind="stable")
        rows: list[list[float]] = []
        for part in self.client.chunks([texts[i][:MAX_TEXT_CHARS] for i in order]):
            got = self.client.request("POST", "/embed", {"inputs": part, "normalize": True})
            if len(got) != len(part):
                raise ServiceError(f"asked for {len(part)} embeddings, got {len(got)}")
            rows += got
        out = np.zeros((len(texts), len(rows[0]) if rows else 0), dtype=np.float32)
        out[order] = np.asarray(rows, dtype=np.float32).reshape(len(texts), -1)
        return out


class OnnxEmbedder:
    """An export directory in process, through the same backend the service runs."""

    def __init__(self, export_dir: str | Path, variant: str = "fp32"):
        from service.engine.backends.onnx import OnnxBackend

        self.encoder = OnnxBackend(export_dir, variant=variant)
        self.name = self.encoder.manifest.name + ("" if variant == "fp32" else f" ({variant})")

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.encoder.encode(list(texts), normalize=True)


class TorchEmbedder:
    """A HF / sentence-transformers directory in process (torch, eval mode, normalised)."""

    def __init__(self, model_dir: str | Path, batch_size: int = 64):
        from core.encoder import SentenceEncoder

        self.encoder = SentenceEncoder.from_pretrained(model_dir)
        self.batch_size = batch_size
        self.name = Path(model_dir).name

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.encoder.encode(list(texts), batch_size=self.batch_size, normalize=True)


def load_embedder(url: str | None = None, model: str | Path | None = None, variant: str = "fp32") -> Embedder:
    """`url` → the running service; `model` → an export directory (has manifest.json) or a HF /
    sentence-transformers directory (has config.json). Exactly one of the two. `variant` picks an
    export's graph (the service's is chosen by its SEMBED_VARIANT)."""
    if (url is None) == (model is None):
        raise ValueError("give exactly one of url (the running service) or model (a directory)")
    path = None if model is None else Path(model)
    if variant != "fp32" and (path is None or not (path / "manifest.json").is_file()):
        raise ValueError(f"variant {variant} names a graph of an export directory: give --model <export>")
    if url is not None:
        return ServiceEmbedder(url)
    if (path / "manifest.json").is_file():
        return OnnxEmbedder(path, variant)
    if (path / "config.json").is_file():
        return TorchEmbedder(path)
    raise ValueError(f"{model} is neither an export directory (manifest.json + model.onnx) "
                     "nor a HF / sentence-transformers directory (config.json)")
