"""Service configuration, from environment variables prefixed SEMBED_ (or a .env file)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    # A prefix, because Kubernetes injects <SERVICE>_PORT-style variables that would collide.
    model_config = SettingsConfigDict(env_prefix="SEMBED_", env_file=".env", extra="ignore",
                                      protected_namespaces=())

    model_dir: Path = Field(Path("models/all-MiniLM-L6-v2"), description="export directory to serve")
    host: str = "0.0.0.0"
    port: int = Field(8080, ge=1, le=65535)

    # Request limits: refuse what would hold the batcher hostage instead of timing out later.
    max_inputs_per_request: int = Field(256, ge=1)
    max_input_chars: int = Field(20_000, ge=1, description="longer texts are refused (tokens beyond "
                                 "max_seq_length are truncated anyway)")
    max_search_k: int = Field(1000, ge=1)

    # Dynamic batching: texts from concurrent requests share one forward pass.
    max_batch_size: int = Field(64, ge=1, description="texts per forward pass")
    batch_wait_ms: float = Field(2.0, ge=0, description="how long a batch waits to fill")
    max_queue_texts: int = Field(8192, ge=1, description="queued texts beyond this get 503")

    intra_op_threads: int = Field(0, ge=0, description="onnxruntime threads; 0 = one per core")
    index_path: Path | None = Field(None, description="persist the search index here (loaded at start)")
