"""Hot reload under load (fake backend, real HTTP): the admin key, names not paths, zero failed requests."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from service.api.registry import ModelRegistry
from service.engine.backends.fake import FakeBackend
from service.engine.core import Engine
from service.settings import Settings
from tests.conftest import LiveServer, until, wait_until

ADMIN = {"authorization": "Bearer admin-key"}


@pytest.fixture
def server(tmp_path):
    registry = ModelRegistry()
    registry.add_in_process("main", Engine(FakeBackend(name="v1", seconds_per_token=2e-4)))
    settings = Settings(backend="fake", admin_api_keys="admin-key", models_root=tmp_path, shutdown_grace_s=10)
    with LiveServer(settings, registry) as live:
        live.registry = registry
        yield live


def test_reload_switches_models_with_zero_failed_requests(server):
    old = server.registry.get("main")

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            stop = asyncio.Event()
            statuses: list[int] = []

            async def client(i: int):
                while not stop.is_set():
                    r = await c.post("/embed", json={"inputs": [f"load {i} {len(statuses)}"] * 3})
                    statuses.append(r.status_code)

            clients = [asyncio.ensure_future(client(i)) for i in range(8)]
            await until(lambda: len(statuses) >= 16, what="the load to be answered")  # the switch comes amid load
            reloaded = await c.post("/admin/models/main/reload", json={"export": "v2"}, headers=ADMIN)
            switched = len(statuses)
            await until(lambda: len(statuses) >= switched + 16, what="the load to be answered after the switch")
            stop.set()
            await asyncio.gather(*clients)
            return reloaded, statuses, (await c.get("/info")).json()

    reloaded, statuses, info = asyncio.run(run())
    assert reloaded.status_code == 200, reloaded.text
    assert reloaded.json()["serving"] == "v2" and reloaded.json()["previous"] == "v1"
    assert len(statuses) > 20 and set(statuses) == {200}  # not one request failed across the switch
    assert info["model_id"] == "v2" and server.registry.get("main") is not old
    wait_until(lambda: not old.ready, 10, what="the old engine to stop once its last requests are answered")


def test_reload_needs_the_admin_key_and_a_name_under_the_root(server):
    with httpx.Client(base_url=server.url) as c:
        assert c.post("/admin/models/main/reload", json={"export": "v2"}).status_code == 401
        wrong = c.post("/admin/models/main/reload", json={"export": "v2"}, headers={"authorization": "Bearer x"})
        assert wrong.status_code == 401 and wrong.json()["error"] == "not an admin key"
        for bad in ("../v2", "/etc", "a/b", ".."):
            r = c.post("/admin/models/main/reload", json={"export": bad}, headers=ADMIN)
            assert r.status_code == 422, bad
        assert c.post("/admin/models/nope/reload", json={"export": "v2"}, headers=ADMIN).status_code == 404
        assert c.post("/embed", json={"inputs": "x"}).status_code == 200  # no API keys: the API stays open


def test_a_reload_refuses_another_kind_of_model(server, monkeypatch):
    from service.manifest import CROSS_ENCODER
    from tests import inprocess

    monkeypatch.setattr(inprocess, "load_engine", lambda s, export_dir: Engine(
        FakeBackend(name=export_dir.name, kind=CROSS_ENCODER)))
    with httpx.Client(base_url=server.url) as c:
        r = c.post("/admin/models/main/reload", json={"export": "reranker"}, headers=ADMIN)
        assert r.status_code == 422
        assert "is a cross-encoder (reranker) and main is an embedding model" in r.json()["error"]
        assert c.post("/embed", json={"inputs": "x"}).status_code == 200  # the old model still serves
        assert c.get("/info").json()["model_id"] == "v1"


def test_admin_routes_are_closed_without_an_admin_key():
    registry = ModelRegistry()
    registry.add_in_process("main", Engine(FakeBackend()))
    with LiveServer(Settings(backend="fake"), registry) as live:
        r = httpx.post(f"{live.url}/admin/models/main/reload", json={"export": "v2"})
        assert r.status_code == 403 and "SEMBED_ADMIN_API_KEYS" in r.json()["error"]


def test_a_real_export_is_verified_before_it_serves(default_export, tmp_path):
    import json
    import shutil

    from fastapi.testclient import TestClient

    from tests.inprocess import app_in_process

    shutil.copytree(default_export, tmp_path / "good")
    shutil.copytree(default_export, tmp_path / "bad")
    manifest = json.loads((tmp_path / "bad" / "manifest.json").read_text())
    manifest["golden"]["embeddings"][0][0] += 0.5
    (tmp_path / "bad" / "manifest.json").write_text(json.dumps(manifest))
    shutil.copytree(default_export, tmp_path / "old")  # a retired layout: pooling before batch_invariant
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    del manifest["batch_invariant"]
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(manifest))
    settings = Settings(model_dir=tmp_path / "good", models_root=tmp_path, admin_api_keys="admin-key")
    with TestClient(app_in_process(settings)) as c:
        before = c.post("/embed", json={"inputs": "hello"}).json()
        refused = c.post("/admin/models/all-MiniLM-L6-v2/reload", json={"export": "bad"}, headers=ADMIN)
        assert refused.status_code == 422 and "golden" in refused.json()["error"]
        stale = c.post("/admin/models/all-MiniLM-L6-v2/reload", json={"export": "old"}, headers=ADMIN)
        assert stale.status_code == 422
        assert f"{tmp_path / 'old' / 'manifest.json'}: it was exported before batch-invariant pooling" in \
            stale.json()["error"] and "export again: python -m export --model " in stale.json()["error"]
        missing = c.post("/admin/models/all-MiniLM-L6-v2/reload", json={"export": "absent"}, headers=ADMIN)
        assert missing.status_code == 404
        assert c.post("/embed", json={"inputs": "hello"}).json() == before  # still the good model
        ok = c.post("/admin/models/all-MiniLM-L6-v2/reload", json={"export": "good"}, headers=ADMIN)
        assert ok.status_code == 200 and c.post("/embed", json={"inputs": "hello"}).json() == before
