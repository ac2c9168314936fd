"""The service as it runs: `python -m service`, a supervisor with API, engine and index processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from benchmarks.machine import process_tree
from tests.conftest import REPO, free_port, wait_ready, wait_until


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def service(tmp_path, request):
    port = free_port()
    env = {**os.environ, **getattr(request, "param", {}), "SEMBED_BACKEND": "fake",
           "SEMBED_MODEL_DIR": str(tmp_path / "fake-model"),
           "SEMBED_PORT": str(port), "SEMBED_HOST": "127.0.0.1", "SEMBED_API_WORKERS": "2",
           "SEMBED_INDEX_PATH": str(tmp_path / "index"), "SEMBED_DRAIN_DELAY_S": "0.2", "SEMBED_ACCESS_LOG": "false",
           "SEMBED_MODELS_ROOT": str(tmp_path), "SEMBED_ADMIN_API_KEYS": "admin-key",
           "SEMBED_MILVUS_URI": str(tmp_path / "milvus.db")}  # read only with SEMBED_INDEX_BACKEND=milvus
    log = open(tmp_path / "service.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        proc.url = url
        proc.log = tmp_path / "service.log"
        yield proc
    finally:
        children = set(process_tree(proc.pid)) - {proc.pid}
        if proc.poll() is None:
            proc.kill()  # the worst case: its processes must not outlive it (they die with their parent)
            proc.wait()
        log.close()

        def left() -> set[int]:
            return {pid for pid in children if _alive(pid)}

        wait_until(lambda: not left(), 10, what=lambda: f"its processes to end; these outlived it: {left()}")


def test_each_process_names_its_role_and_the_routes_work_across_them(service):
    titles = sorted(process_tree(service.pid).values())
    assert sum(t.startswith("sembed: api ") for t in titles) == 2, titles
    assert any(t == "sembed: engine fake-model cpu" for t in titles), titles
    assert "sembed: index" in titles and "sembed: supervisor" in titles, titles
    with httpx.Client(base_url=service.url, timeout=10) as c:
        vectors = c.post("/embed", json={"inputs": ["a b c", "d e"]}).json()
        assert len(vectors) == 2 and len(vectors[0]) == 8
        # writes go to the one index process whichever API process takes them; every API process reads them
        for i in range(6):
            added = c.post("/index/documents", json={"documents": [{"id": f"d{i}", "text": f"doc {i}"}]})
            assert added.status_code == 200
        for _ in range(6):
            assert c.post("/search", json={"query": "doc 3", "k": 1}).json()["results"][0][0]["id"] == "d3"
        metrics = c.get("/metrics").text  # every process's samples, under one name each
        texts = [line for line in metrics.splitlines() if line.startswith("sembed_embedded_texts_total")]
        assert texts and float(texts[0].split()[-1]) >= 14, texts
        # the index size per collection, whichever API process wrote last
        assert c.post("/collections", json={"name": "notes"}).status_code == 201
        c.post("/collections/notes/documents", json={"documents": [{"id": "n", "text": "a note"}]})
        sizes = index_sizes(c.get("/metrics").text)
        assert sizes == {"default": 6, "notes": 1}, sizes


def index_sizes(exposition: str) -> dict[str, float]:
    """sembed_index_documents by its collection label."""
    import re

    return {m[1]: float(m[2]) for m in re.finditer(r'^sembed_index_documents\{collection="([^"]*)"\} (\S+)$',
                                                   exposition, flags=re.M)}


@pytest.mark.parametrize("service", [{"SEMBED_INDEX_BACKEND": "milvus"}], indirect=True)
def test_milvus_lite_lives_in_the_index_process_and_every_api_process_reaches_it(service):
    """Milvus Lite is a file one process may open: it gets the writer process, as the local index does."""
    titles = process_tree(service.pid).values()
    assert "sembed: index" in titles
    with httpx.Client(base_url=service.url, timeout=30) as c:
        for i in range(4):
            assert c.post("/index/documents", json={"documents": [{"id": f"m{i}", "text": f"milvus {i}"}]}).is_success
        for _ in range(4):  # whichever API process answers
            assert c.post("/search", json={"query": "milvus 2", "k": 1}).json()["results"][0][0]["id"] == "m2"


def test_a_killed_engine_fails_fast_then_comes_back_by_itself(service):
    engine = next(pid for pid, t in process_tree(service.pid).items() if t.startswith("sembed: engine"))
    with httpx.Client(base_url=service.url, timeout=10) as c:
        assert c.post("/embed", json={"inputs": "before"}).status_code == 200
        os.kill(engine, signal.SIGKILL)
        # never a hang: answered (by the restarted engine, or a 503 while it restarts) well within the 60 s request
        # deadline; a timeout contract, 10 s leaves room for a loaded machine
        r = c.post("/embed", json={"inputs": "during"}, timeout=10)
        assert r.status_code in (200, 503), (r.status_code, r.text)
        wait_ready(service.url, service, timeout=30)
        # each API process notices the restart by its own heartbeat, within a second: until then it may still answer 503
        wait_until(lambda: c.post("/embed", json={"inputs": "after"}).status_code == 200, 10,
                   what="the API processes to serve from the restarted engine")
        assert all(c.post("/embed", json={"inputs": f"then {i}"}).status_code == 200 for i in range(10))
    now = [pid for pid, t in process_tree(service.pid).items() if t.startswith("sembed: engine")]
    assert now and engine not in now


def test_a_killed_api_process_is_replaced(service):
    api = [pid for pid, t in process_tree(service.pid).items() if t.startswith("sembed: api ")]
    os.kill(api[0], signal.SIGKILL)

    def replaced() -> bool:
        now = [pid for pid, t in process_tree(service.pid).items() if t.startswith("sembed: api ")]
        return len(now) == 2 and api[0] not in now

    wait_until(replaced, 30, what="a new API process in place of the killed one")
    wait_ready(service.url, service)


def test_sigterm_drains_in_flight_requests_then_exits_zero(service):
    answers = []
    with httpx.Client(base_url=service.url, timeout=20) as c:
        c.post("/embed", json={"inputs": "warm"})
        load = threading.Thread(target=lambda: answers.extend(
            c.post("/embed", json={"inputs": [f"text {i}"] * 8}).status_code for i in range(20)))
        load.start()
        wait_until(lambda: answers, 20, what="the load's first answer")  # the load runs: SIGTERM comes amid it
        service.send_signal(signal.SIGTERM)
        load.join(20)
    assert service.wait(30) == 0, Path(service.log).read_text()[-3000:]
    assert answers and all(s == 200 for s in answers), answers


def test_a_reload_moves_every_api_process_to_a_new_engine_process(service):
    old = next(pid for pid, t in process_tree(service.pid).items() if t.startswith("sembed: engine"))
    with httpx.Client(base_url=service.url, timeout=60) as c:
        before = c.post("/embed", json={"inputs": "same text"}).json()
        r = c.post("/admin/models/fake-model/reload", json={"export": "v2"},
                   headers={"Authorization": "Bearer admin-key"})
        assert r.status_code == 200 and r.json()["serving"] == "v2", r.text
        for _ in range(6):  # whichever API process answers, it serves the new model
            assert c.get("/info").json()["model_id"] == "v2"
        assert c.post("/embed", json={"inputs": "same text"}).json() == before  # the fake's vectors: by tokens
    wait_until(lambda: old not in process_tree(service.pid), 30, what="the old engine to drain and exit")
    engines = [t for t in process_tree(service.pid).values() if t.startswith("sembed: engine")]
    assert old not in process_tree(service.pid) and engines == ["sembed: engine fake-model cpu"]


def test_an_open_port_without_keys_and_a_memory_only_index_are_said_at_start(monkeypatch):
    from service.settings import MEMORY_ONLY, Settings
    from service.supervisor import startup_warnings

    monkeypatch.delenv("SEMBED_INDEX_PATH", raising=False)  # conftest's memory-only default for tests
    loud = startup_warnings(Settings(backend="fake", host="0.0.0.0", index_path=MEMORY_ONLY))
    assert any("no API key" in w for w in loud) and any("memory only" in w for w in loud)
    assert startup_warnings(Settings(backend="fake", host="127.0.0.1")) == []  # the default: on disk
    assert startup_warnings(Settings(backend="fake", host="127.0.0.1", index_path="/tmp/idx")) == []
    assert not any("no API key" in w for w in startup_warnings(Settings(backend="fake", api_keys="k")))


def test_the_index_persists_by_default_under_the_data_directory(tmp_path):
    """No index setting at all: the index lives in ./data/index of the working directory and survives a restart."""
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEMBED_")}
    env.update(PYTHONPATH=str(REPO), SEMBED_BACKEND="fake", SEMBED_MODEL_DIR=str(tmp_path / "fake-model"),
               SEMBED_HOST="127.0.0.1", SEMBED_API_WORKERS="1", SEMBED_DRAIN_DELAY_S="0", SEMBED_ACCESS_LOG="false")
    doc = {"documents": [{"id": "kept", "text": "a document that outlives a restart"}]}
    for run in ("first", "second"):
        port = free_port()
        with open(tmp_path / f"{run}.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=work, env={**env, "SEMBED_PORT": str(port)},
                                    stdout=log, stderr=subprocess.STDOUT)
            try:
                url = f"http://127.0.0.1:{port}"
                wait_ready(url, proc)
                if run == "first":
                    assert httpx.post(f"{url}/index/documents", json=doc).json()["total"] == 1
                else:  # the same document, found again after the restart
                    hits = httpx.post(f"{url}/search", json={"query": "outlives a restart", "k": 1}).json()
                    assert [h["id"] for h in hits["results"][0]] == ["kept"]
            finally:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(30) == 0
        text = (tmp_path / f"{run}.log").read_text()
        assert "memory only" not in text and str(work / "data" / "index") in text, text[-2000:]
    assert any((work / "data" / "index").iterdir())


def test_a_memory_only_index_is_chosen_explicitly_and_said_loudly(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEMBED_")}
    env.update(PYTHONPATH=str(REPO), SEMBED_BACKEND="fake", SEMBED_MODEL_DIR=str(tmp_path / "fake-model"),
               SEMBED_HOST="127.0.0.1", SEMBED_API_WORKERS="1", SEMBED_DRAIN_DELAY_S="0", SEMBED_PORT=str(port),
               SEMBED_INDEX_PATH=":memory:")
    with open(tmp_path / "service.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=tmp_path, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            wait_ready(f"http://127.0.0.1:{port}", proc)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    text = (tmp_path / "service.log").read_text()
    assert "WARNING" in text and "the index lives in memory only" in text, text[-2000:]
    assert not (tmp_path / "data").exists()


def test_ctrl_c_stops_cleanly_without_a_traceback(service):
    service.send_signal(signal.SIGINT)
    assert service.wait(30) == 0
    log = Path(service.log).read_text()
    assert "Traceback" not in log and "stopped" in log, log[-3000:]
