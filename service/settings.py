"""Service configuration, from environment variables prefixed SEMBED_ (or a .env file)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.hardware import usable_cpus

#: The SEMBED_INDEX_PATH that asks for an index in memory only (SQLite's spelling of the same wish).
MEMORY_ONLY = ":memory:"


class Settings(BaseSettings):
    # A prefix, because Kubernetes injects <SERVICE>_PORT-style variables that would collide.
    model_config = SettingsConfigDict(env_prefix="SEMBED_", env_file=".env", extra="ignore",
                                      protected_namespaces=())

    # --- what to serve ----------------------------------------------------------------------------
    model_dir: Path = Field(Path("models/all-MiniLM-L6-v2"), description="export directory to serve")
    models: str | None = Field(None, description="several exports: 'name=dir,name2=dir2'; the first is the "
                               "default, the OpenAI `model` field picks one; replaces model_dir")
    backend: Literal["onnx", "null", "fake"] = Field("onnx", description="null: the export's tokenizer and "
                                                     "dimension, no model compute (measures the server itself); "
                                                     "fake: a model-free backend for tests")
    device: Literal["cpu", "cuda"] = Field("cpu", description="cuda fails at start if onnxruntime has no CUDA")
    variant: Literal["fp32", "int8", "fp16"] | None = Field(None, description="which graph of the export to run "
                                                            "(its manifest lists what it has; one it lacks is served "
                                                            "as fp32, with a warning); int8: the export's int8 graph, "
                                                            "the same on every CPU; unset: fp16 on cuda "
                                                            "where the export has one (written only when it passed "
                                                            "its quality gate), else fp32")
    tensorrt: bool = Field(False, description="cuda: onnxruntime's TensorRT provider first (engines cached beside "
                           "the export); fails at start where TensorRT is not installed")
    intra_op_threads: int = Field(0, ge=0, description="onnxruntime threads per pass; 0 = one per core this "
                                  "process may use (its CPU affinity, at most its cgroup's CPU quota)")
    # Two by default: onnxruntime's threads wait for each other after every op of a pass, and two passes at once on
    # half the cores each get through more than one on all of them (RESULTS.md, "Serving on a CPU").
    streams: int = Field(0, ge=0, description="CPU: passes an engine runs at once, each on SEMBED_INTRA_OP_THREADS / "
                         "streams threads, a pass alone in the queue on all of them (the same bits either way; one "
                         "more copy of the model's weights in memory); 0 = 2 (1 with one core, and on cuda); 1: one "
                         "pass at a time")
    # Off by default: under load the API processes share the cores with the engine's threads, and threads that
    # spin take the CPU the API processes need (RESULTS.md, "Against other servers").
    intra_op_spinning: bool = Field(False, description="onnxruntime threads busy-wait within a pass (never between "
                                    "passes): short passes gain a little where the engine has cores to itself")
    # With padded lengths a multiple of this, a text's vector has the same bits whatever batch it
    # shares; 0 measures the smallest such multiple for this CPU at start (see backends/onnx.py).
    pad_to_multiple_of: int = Field(0, ge=0, description="pad every pass to a multiple of this many tokens; 0 = "
                                    "the smallest that keeps batching bit-exact on this CPU, measured at start")

    host: str = Field("0.0.0.0", description="address to listen on (a warning at start if beyond loopback with no "
                      "API key)")
    port: int = Field(8080, ge=1, le=65535, description="port to listen on")
    grpc_port: int = Field(0, ge=0, le=65535, description="TEI's gRPC API (docs/grpc.md) on this port too, from "
                           "every API process (SO_REUSEPORT); 0: off")

    # --- request limits -------------------------------------------------------------------------
    max_client_batch_size: int = Field(256, ge=1, description="inputs per request (more: 422)")
    max_request_bytes: int = Field(2_000_000, ge=1024, description="request body size (more: 413); TEI's 2 MB")
    header_timeout_s: float = Field(10.0, gt=0, description="request headers not complete by then: 408, closed")
    body_timeout_s: float = Field(30.0, gt=0, description="a body not fully received by then gets 408")
    auto_truncate: bool = Field(True, description="truncate inputs over max_seq_length tokens unless a "
                                "request says truncate=false (then they get 422)")
    max_search_k: int = Field(1000, ge=1, description="largest k a search may ask for (more: 422)")

    # --- processes -------------------------------------------------------------------------------
    api_workers: int = Field(0, ge=0, description="API processes (HTTP, validation, tokenisation, answers) in front "
                             "of the engines; 0 = half the CPUs (at most the cgroup's quota), at least 1 and at most "
                             "8 (the other half runs the model: onnxruntime on a CPU, feeding the device on a GPU)")

    # --- the vector cache (service/api/cache.py) --------------------------------------------------
    # On by default: a hit gives the bits a miss gives, so all it costs is memory, bounded here per API process (an
    # entry is its vector's float32 bytes, its text and a few hundred bytes of bookkeeping: docs/serving.md, "Cache").
    cache_mb: float = Field(64.0, ge=0, description="each API process's cache of text vectors, in MB: a text seen "
                            "before (same model, prompt, truncation, normalize) is answered without tokenising or "
                            "the engine, with the same bits; least recently used out first; emptied for a model on "
                            "reload; the service holds up to SEMBED_API_WORKERS times this; 0: off")

    # --- the engine -------------------------------------------------------------------------------
    # Unset: TEI's 16384 on a GPU; 1024 on a CPU, shared by the engine's streams (512 tokens a pass with two): a
    # pass's activations then stay in a core's cache and it computes faster, a one-text request waits less for it,
    # and the engine holds less memory (RESULTS.md, Serving on a CPU).
    max_batch_tokens: int | None = Field(None, ge=16, description="tokens per forward pass, padding included")
    # Unset: 64 on a CPU (a pass of more short rows is no faster per row there, and a one-text request
    # would wait for it); 1024 on a GPU, where a pass of 1024 short rows costs about what 64 do, so the
    # token budget, not a row count, should bound it (TEI sets no row cap).
    max_batch_requests: int | None = Field(None, ge=1, description="inputs per forward pass")
    # Unset: 1.25 on a CPU, where a pass costs about its tokens padding included and little besides, so rows
    # of unlike lengths are better in passes of their own (RESULTS.md, Serving on a CPU); 2 on a GPU, where a
    # pass of more rows costs little more and each pass has a fixed cost.
    max_padding_ratio: float | None = Field(None, ge=1.0, le=16.0, description="a text may join a forward pass "
                                            "only if the pass's padded length stays within this many times its own")
    max_queue_wait_s: float = Field(5.0, gt=0, description="admission: a request the engine expects to keep "
                                    "longer than this (the tokens ahead of it over the measured pass rate) gets "
                                    "429 with Retry-After; small requests still get in")
    max_queued_inputs: int = Field(8192, ge=1, description="inputs an engine holds at most, whatever their "
                                   "expected wait (a memory bound); beyond it 429")
    request_timeout_s: float = Field(60.0, gt=0, description="inputs queued longer than this are dropped (503)")
    retry_after_s: int = Field(1, ge=1, description="Retry-After sent with 503")

    # --- shutdown ---------------------------------------------------------------------------------
    drain_delay_s: float = Field(5.0, ge=0, description="after SIGTERM, not ready but still serving this long "
                                 "(let load balancers notice) before in-flight requests are drained")
    shutdown_grace_s: float = Field(30.0, gt=0, description="in-flight requests get this long to finish")

    # --- access ---------------------------------------------------------------------------------
    api_keys: str | None = Field(None, description="comma-separated keys; set, every route but the probes "
                                 "needs Authorization: Bearer <key>; no key here nor in the file: the service is "
                                 "open, and a WARNING at start says so")
    api_keys_file: Path | None = Field(None, description="more keys, one per line (a mounted secret); named "
                                       "but missing: the service does not start")
    admin_api_keys: str | None = Field(None, description="keys for /admin/ routes (model reload); unset: those "
                                       "routes are refused")
    admin_api_keys_file: Path | None = Field(None, description="more admin keys, one per line (a mounted secret)")
    models_root: Path | None = Field(None, description="exports a reload may name (a folder name under it, never "
                                     "a path from the request)")
    metrics_public: bool = Field(True, description="false: /metrics needs a key too")
    cors_origins: str | None = Field(None, description="comma-separated origins allowed to call from a browser "
                                     "('*' for any); unset: no CORS headers")
    opentelemetry: bool = Field(False, description="FastAPI's native OpenTelemetry spans, metrics and logs, for "
                                "deployments that configure an OpenTelemetry provider")
    access_log: bool = Field(True, description="one JSON line per request: id, method, path, status, time")

    index_backend: Literal["local", "milvus"] = Field("local", description="local: FAISS in this process with a "
                                                     "write-ahead log (one node, one writer); milvus: a Milvus "
                                                     "server holds the vectors (stateless replicas)")
    # Persistent by default: an index that a restart empties surprises everyone once. The data directory
    # is relative to the working directory (`make serve`: the repository's git-ignored data/; the images
    # set /data, their volume).
    data_dir: Path = Field(Path("data"), description="where the service keeps what must outlive it: the local "
                           "index under `<data_dir>/index`")
    index_path: Path | None = Field(None, description=f"local: where the log and snapshots live; unset: "
                                    f"`<data_dir>/index`; `{MEMORY_ONLY}`: memory only, lost at exit (said loudly "
                                    "at start)")
    index_type: str = Field("Flat", description="the default collection's index: Flat, HNSW32, IVF1024,SQ8, ...")
    index_lexical: bool = Field(False, description="local: the default collection (/index/documents, /search) keeps "
                                "a lexical (BM25) index of its texts, for search modes lexical and hybrid "
                                "(docs/hybrid-search.md); set on an index that holds documents, it is built from their "
                                "texts at start, and unset, dropped")
    index_fsync: bool = Field(True, description="fsync the log before answering a write (off: a crash of the "
                              "machine may lose acknowledged writes)")
    index_snapshot_every_ops: int = Field(10_000, ge=1, description="snapshot after this many writes ...")
    index_snapshot_every_s: float = Field(300.0, gt=0, description="... or this many seconds with writes")
    index_gpu: Literal["auto", "off"] = Field("auto", description="local: auto searches Flat and IVF collections "
                                              "on GPU 0 when FAISS has GPU support (the gpu extra) and sees a "
                                              "GPU (HNSW stays on the CPU); off: CPU only")
    index_oversample: int = Field(20, ge=1, le=100, description="collections with quantization int8 or binary: "
                                  "the compact structure's k × this best candidates are rescored with the float "
                                  "vectors (a search's `oversample` overrides it)")
    index_float_vectors: Literal["memory", "disk"] = Field("memory", description="local: where quantized "
                                                           "collections keep the float vectors that rescore: in "
                                                           "memory, or in files under the index folder, memory-mapped "
                                                           "(the page cache holds what searches touch)")
    index_lexical_rebuild: float = Field(0.25, ge=0, le=1, description="local: a lexical index is rebuilt from "
                                         "the live texts (in the background) once deleted and replaced items, "
                                         "which its BM25 statistics count until then, are over this fraction of "
                                         "those it holds; 0: after every delete or replace (then scores are those "
                                         "of the live items alone), 1: never (docs/hybrid-search.md)")
    # --- long documents (service/chunking.py, docs/long-documents.md) -------------------------------
    chunking: bool = Field(True, description="documents routes: a text over the model's window becomes chunks "
                           "(token windows with overlap, cut at sentence ends), a vector each, and search answers "
                           "each document at its best chunk; false: such a text is truncated, one vector. A "
                           "request's `chunking` overrides it; the milvus backend stores one vector per document, "
                           "so there it is off unless a request asks (then refused)")
    chunk_size: int = Field(0, ge=0, description="tokens per chunk; 0: the model's window (max_seq_length less its "
                            "special tokens and any default prompt's); a request's chunking.size overrides it")
    chunk_overlap: int = Field(32, ge=0, description="tokens consecutive chunks share (at most a quarter of the "
                               "chunk size); a request's chunking.overlap overrides it")
    max_request_chunks: int = Field(4096, ge=1, description="chunks one request may make (documents, or /embed and "
                                    "/v1/embeddings with chunking); more: 422 and nothing written")
    milvus_uri: str | None = Field(None, description="milvus: http://host:19530, or a Milvus Lite file path")

    @field_validator("models")
    @classmethod
    def _pairs(cls, v: str | None) -> str | None:
        if v is not None:
            parse_models(v)
        return v

    @model_validator(mode="after")
    def _lexical_is_local(self) -> Settings:
        if self.index_lexical and self.index_backend != "local":
            raise ValueError("SEMBED_INDEX_LEXICAL=true needs SEMBED_INDEX_BACKEND=local: the milvus backend keeps no "
                             "lexical index (docs/hybrid-search.md)")
        return self

    def model_dirs(self) -> list[tuple[str | None, Path]]:
        """(name, export dir) pairs; a None name means 'the manifest's own name'."""
        if self.models:
            return [(name, Path(d)) for name, d in parse_models(self.models)]
        return [(None, self.model_dir)]

    def index_location(self) -> Path | None:
        """Where the local index keeps its log and snapshots; None: in memory only (SEMBED_INDEX_PATH=:memory:)."""
        if self.index_path is None:
            return self.data_dir / "index"
        return None if str(self.index_path) == MEMORY_ONLY else self.index_path

    def batch_token_budget(self) -> int:
        return self.max_batch_tokens or (16384 if self.device == "cuda" else 1024)

    def index_needs_writer_process(self) -> bool:
        """The local index, or Milvus Lite (a file, one process at a time), lives in one process of its own;
        a Milvus server is reached from every API process directly."""
        remote = (self.milvus_uri or "").startswith(("http://", "https://", "tcp://", "grpc://"))
        return self.index_backend == "local" or not remote

    def batch_row_cap(self) -> int:
        return self.max_batch_requests or (1024 if self.device == "cuda" else 64)

    def padding_ratio(self) -> float:
        return self.max_padding_ratio or (2.0 if self.device == "cuda" else 1.25)

    def api_worker_count(self) -> int:
        return self.api_workers or min(8, max(1, usable_cpus() // 2))


def reference() -> str:
    """Every setting as a Markdown table (docs/settings.md is this, and a test keeps them equal)."""
    rows = ["| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        kind = str(field.annotation).replace("typing.", "").replace("pathlib.", "").replace("<class '", "")
        kind = kind.replace("'>", "").replace("|", "or")
        default = "unset" if field.default is None else f"`{field.default}`"
        rows.append(f"| `SEMBED_{name.upper()}` | {kind} | {default} | {field.description or ''} |".replace("\n", " "))
    return ("# Settings\n\nEnvironment variables (or a `.env` file) read by `service/settings.py`; generated by "
            "`python -m service.settings > docs/settings.md`.\n\n" + "\n".join(rows) + "\n")



def parse_models(spec: str) -> list[tuple[str, str]]:
    pairs = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, path = part.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"models entry {part!r} is not name=dir")
        pairs.append((name.strip(), path.strip()))
    names = [n for n, _ in pairs]
    if not pairs or len(set(names)) != len(names):
        raise ValueError(f"models must name each export once: {spec!r}")
    return pairs


if __name__ == "__main__":
    print(reference(), end="")
