"""The vector cache in `python -m service` (e2e): SEMBED_CACHE_MB reaches every API process, /metrics sums their
hits, misses and bytes, and a reload through the supervisor empties each process's entries for the model."""

from __future__ import annotations

import httpx

from tests.conftest import ServiceProcess

ADMIN = {"Authorization": "Bearer admin-key"}


def samples(exposition: str, name: str) -> float:
    """The sum of a metric's samples over its labels (0 if absent)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines()
               if line.split("{", 1)[0].split(" ", 1)[0] == name)


def test_the_cache_across_api_processes_and_a_reload(tmp_path):
    env = {"SEMBED_BACKEND": "fake", "SEMBED_MODEL_DIR": str(tmp_path / "fake-model"), "SEMBED_API_WORKERS": "2",
           "SEMBED_CACHE_MB": "8", "SEMBED_MODELS_ROOT": str(tmp_path), "SEMBED_ADMIN_API_KEYS": "admin-key"}
    with ServiceProcess(env, tmp_path / "service.log") as service, \
            httpx.Client(base_url=service.url, timeout=60) as c:
        texts = ["a b", "c d e"]
        embedded = samples(c.get("/metrics").text, "sembed_embedded_texts_total")  # the start's own passes
        first = c.post("/embed", json={"inputs": texts})
        assert first.status_code == 200
        for _ in range(9):  # whichever API process answers: the same bytes
            assert c.post("/embed", json={"inputs": texts}).content == first.content
        metrics = c.get("/metrics").text
        hits, misses = samples(metrics, "sembed_cache_hits_total"), samples(metrics, "sembed_cache_misses_total")
        assert hits + misses == 20 and 2 <= misses <= 4, (hits, misses)  # each API process embeds a text once
        assert samples(metrics, "sembed_embedded_texts_total") - embedded == misses
        assert samples(metrics, "sembed_cache_entries") == misses and samples(metrics, "sembed_cache_bytes") > 0

        r = c.post("/admin/models/fake-model/reload", json={"export": "v2"}, headers=ADMIN)
        assert r.status_code == 200, r.text
        metrics = c.get("/metrics").text
        assert samples(metrics, "sembed_cache_entries") == 0 and samples(metrics, "sembed_cache_bytes") == 0
        assert c.post("/embed", json={"inputs": texts}).status_code == 200
        assert samples(c.get("/metrics").text, "sembed_cache_misses_total") == misses + 2  # embedded afresh
