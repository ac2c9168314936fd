"""benchmarks/peers.py (`make bench-peers`): its figures, its vector check against a real HTTP server that pools
wrong, and a one-second run against our own service (no Infinity needed)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from benchmarks import peers


def test_percentiles_and_a_phases_figures_are_computed_right():
    latencies = [i / 1000 for i in range(1, 101)]  # 1 .. 100 ms
    assert peers.percentile(latencies, 50) == pytest.approx(0.0505)
    assert peers.percentile(latencies, 99) == pytest.approx(0.09901)
    assert np.isnan(peers.percentile([], 50))
    figures = peers.summarize(latencies, items_per_request=32, seconds=2.0, server_cpu_s=1.6, client_cpu_s=0.021,
                              errors=5)
    assert figures["requests"] == 100 and figures["errors"] == 5
    assert figures["sent_s"] == pytest.approx(1600) and figures["req_s"] == pytest.approx(50)  # failed: no texts
    assert figures["p50_ms"] == pytest.approx(50.5) and figures["p99_ms"] == pytest.approx(99.01)
    assert figures["server_cpu_ms_per_item"] == pytest.approx(1600 / 3200)
    assert figures["client_cpu_us_per_request"] == pytest.approx(200)  # over every request sent, failed ones too
    rounds = [{"sent_s": 10.0, "p99_ms": 5.0}, {"sent_s": 30.0, "p99_ms": 1.0}, {"sent_s": 20.0, "p99_ms": 9.0}]
    assert peers.median_of_rounds(rounds) == {"sent_s": 20.0, "p99_ms": 5.0}
    assert peers.cosines(np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([[2.0, 0.0], [0.0, 1.0]])) == pytest.approx(
        [1.0, 2 ** -0.5])


def test_a_phases_time_is_counted_per_connection_with_requests_in_flight_at_the_end_counted_whole():
    # two connections from t=10: one answers at 12 and 14 (2 in 4 s), the other at 13.5 and 15 (2 in 5 s, its
    # second answered after the phase's time was up); a failed answer counts for neither
    load = peers.Load(10.0, [(0, 10.0, 12.0, 200), (1, 10.0, 13.5, 200), (0, 12.0, 14.0, 200),
                             (1, 13.5, 15.0, 200), (1, 15.0, 15.5, 500)])
    rate = 2 / 4 + 2 / 5
    assert load.seconds() == pytest.approx(4 / rate)
    assert peers.Load(0.0, [(0, 0.0, 1.0, 500)]).seconds() == float("inf")


def serve_vectors(vectors: dict[str, list[float]]) -> ThreadingHTTPServer:
    """An OpenAI-shaped POST /v1/embeddings answering each text's vector from `vectors`, on a loopback port."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the load generator's connections are

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
            answer = json.dumps({"object": "list", "data": [
                {"object": "embedding", "index": i, "embedding": vectors[t]} for i, t in enumerate(texts)]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_vector_check_fails_a_server_that_pools_with_cls_and_passes_one_that_pools_right(default_model_dir):
    from sentence_transformers import SentenceTransformer

    texts = ["A man is playing a guitar.", "The cat sleeps on the warm windowsill all afternoon.",
             "Stocks fell sharply on Monday.", "a bird"]
    model = SentenceTransformer(str(default_model_dir), device="cpu")
    tokens = model.encode(texts, output_value="token_embeddings")  # the transformer's output, per text
    mean = {t: (v.mean(0) / np.linalg.norm(v.mean(0))).tolist() for t, v in zip(texts, tokens)}
    cls = {t: (v[0] / np.linalg.norm(v[0])).tolist() for t, v in zip(texts, tokens)}  # Infinity's ONNX default
    reference = peers.reference_vectors(default_model_dir, texts)
    for vectors, should_pass in ((cls, False), (mean, True)):
        server = serve_vectors(vectors)
        try:
            cosine, ok = peers.check_vectors(server.server_address[1], texts, reference, singles=2)
        finally:
            server.shutdown()
            server.server_close()
        assert ok is should_pass, cosine
        if should_pass:
            assert cosine > 0.9999
        else:
            assert 0.3 < cosine < 0.9  # CLS pooling: far from the model's vectors, as Infinity's default is


def test_a_short_run_against_our_service_alone_checks_it_and_measures_every_phase(default_export, shared_data,
                                                                                   tmp_path):
    out = tmp_path / "peers.json"
    status = peers.main(["--model-dir", str(default_export), "--data-dir", str(shared_data), "--servers", "sembed",
                         "--rounds", "1", "--duration", "1", "--out", str(out)])
    record = json.loads(out.read_text())
    ours = record["results"]["sembed"]
    assert ours["ok"] and ours["min_cosine"] >= peers.MIN_COSINE and ours["rss_mib"] > 0
    assert set(ours["phases"]) == {"c1", "c64", "batch32 short", "batch32 long"}
    for name, figures in ours["phases"].items():
        assert figures["requests"] > 0 and figures["errors"] == 0, (name, figures)
        assert figures["sent_s"] > 0 and 0 < figures["p50_ms"] <= figures["p99_ms"], (name, figures)
        assert figures["server_cpu_ms_per_item"] > 0 and figures["client_cpu_us_per_request"] > 0, (name, figures)
    assert record["cpu"].startswith("CPU: ") and len(record["load_average"]) == 2 and record["commit"]
    # alone, nothing to compare with: only the checks of its own vectors and answers, both passed
    assert record["checks"] == {k: True for k in record["checks"]} and len(record["checks"]) == 2
    assert status == 0
