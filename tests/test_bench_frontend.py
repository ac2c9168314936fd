"""benchmarks/frontend.py's measurements, for real on a tiny run: one API worker, the null backend,
a second or two of wrk load, the malformed bodies."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from benchmarks import frontend


@pytest.fixture(scope="module")
def wrk() -> str:
    if shutil.which("wrk") is None:  # the test never installs it
        pytest.skip("wrk not installed (make wrk)")
    return frontend.locate_wrk()


def test_a_tiny_run_measures_the_server_and_every_malformed_body_answers_4xx(null_export, wrk):
    texts = [f"a short sentence number {i} about a dog in the park ." for i in range(64)]
    plan = frontend.phases(texts, concurrency=8, batch_concurrency=2)
    with frontend.running_service(null_export, workers=1) as service:
        workers = frontend.api_workers(service.proc.pid)
        assert list(workers.values()) == ["sembed: api 1"]
        tree = frontend.process_tree(service.proc.pid)
        assert any(t.startswith("sembed: engine") for t in tree.values()) and "sembed: supervisor" in tree.values()

        figures = {}
        for name, path, bodies, per_request, connections in (plan[0], plan[4]):  # singles, batch-256 base64
            figures[name] = frontend.load_phase(wrk, service, path, bodies, connections=connections, clients=2,
                                                duration=1, sentences_per_request=per_request)
        rss = {title: frontend.rss_mb(pid) for pid, title in workers.items()}
        malformed = frontend.check_malformed(service.port)

    for p in figures.values():
        assert p["requests"] > 0 and p["non_2xx"] == 0 and p["socket_errors"] == 0, p
        for key in ("req_s", "sent_s", "p50_ms", "p99_ms", "server_cpu_s", "server_us_per_request",
                    "server_us_per_sentence", "client_machine_share"):
            assert p[key] > 0, (key, p)
        assert p["p50_ms"] <= p["p99_ms"]
        assert abs(sum(p["process_share"].values()) - 1) < 1e-6  # every process's share, summing to all
        assert "sembed: api 1" in p["process_share"]
    singles, batch = figures["singles"], figures["batch256 base64"]
    assert singles["sent_s"] == singles["req_s"]
    assert batch["sent_s"] == pytest.approx(256 * batch["req_s"])
    assert 0 < rss["sembed: api 1"] < 2000

    bad = [m for m in malformed if m["status"] is None or not 400 <= m["status"] < 500]
    assert not bad, bad
    assert len(malformed) == len(frontend.malformed_bodies()) * len(frontend.MALFORMED_PATHS)


def test_the_framework_floor_app_answers_what_the_service_answers_and_is_measured(wrk):
    """The floor the bench prints beside the service: a bare FastAPI route, under the same wrk load."""

    bodies = [json.dumps({"inputs": f"sentence {i}"}).encode() for i in range(16)]
    with frontend.framework_floor() as floor:
        assert frontend.request(floor.port, "POST", "/embed", bodies[0]) == 200
        assert frontend.request(floor.port, "POST", "/embed", b'{"inputs": 3}') == 422
        p = frontend.load_phase(wrk, floor, "/embed", bodies, connections=4, clients=1, duration=1)
    assert p["requests"] > 0 and p["non_2xx"] == 0 and p["server_us_per_request"] > 0
    assert list(p["process_share"].values()) == [1.0]  # one process: uvicorn itself


def test_percentiles_of_a_merged_histogram():
    histogram = {100: 50, 200: 49, 5000: 1}
    assert frontend.percentile(histogram, 0.5) == 100
    assert frontend.percentile(histogram, 0.99) == 200
    assert frontend.percentile(histogram, 1.0) == 5000


def test_shape_costs_times_passes_of_random_row_counts_with_and_without_row_buckets(default_export):
    """The GPU bench's per-shape planning measurement, run for real on the CPU (where buckets change nothing)."""
    costs = frontend.shape_costs(default_export, "fp32", device="cpu", passes=4, max_rows=3)
    assert set(costs) == {"no row buckets", "row buckets"}
    for t in costs.values():
        assert 0 < t["median_ms"] <= t["max_ms"] and t["seen_again_ms"] > 0


def test_the_engine_bench_measures_cpu_per_request_for_each_size(null_export, tmp_path, capsys):
    from benchmarks import engine

    assert engine.main(["--model-dir", str(null_export), "--data-dir", str(tmp_path / "none"), "--rows", "1,8",
                        "--rows-per-round", "64", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CPU: ")
    rows = {int(line.split()[0]): [float(x) for x in line.split()[1:]] for line in lines[-2:]}
    assert set(rows) == {1, 8}
    for n, (per_request, per_row) in rows.items():
        assert per_request > 0 and abs(per_row - per_request / n) < 0.01 * per_request


def test_the_micro_bench_times_each_hot_path_choice(default_export, capsys):
    from benchmarks import micro

    assert micro.main(["--model-dir", str(default_export), "--repeat", "40"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CPU: ") and len(lines) == 12
    assert "pybase64" in lines[1] and "orjson" in lines[2] and "tokeniser" in lines[3] and "64 frames" in lines[5]
    assert "bundle of 16" in lines[6] and len(re.findall(r"[0-9.]+ µs", lines[6])) == 2
    defaults, kept = (float(line.split(": ")[1].split()[0]) for line in lines[8:10])
    assert kept < defaults  # the same pattern tests/test_process.py checks closely
    # a real engine process answered both sizes; a round trip through it crosses at least one process wake-up
    figures = [float(x) for x in re.findall(r"([0-9.]+) µs", lines[10])]
    assert "idle engine process" in lines[10] and len(figures) == 4 and all(f > 0 for f in figures)
    assert min(figures[:2]) > figures[3]
    # both transports echoed every message back (a figure each), through a real second process
    assert "ZeroMQ ipc" in lines[11] and len(transports := re.findall(r"([0-9.]+) µs", lines[11])) == 2
    assert all(float(us) > 0 for us in transports)
