"""`make bench-frontend`: what the server itself costs, with the null backend (no model compute).

For 1, 2 and 4 API workers, each a fresh `python -m service` with SEMBED_BACKEND=null (the export's
real tokenizer and dimension, constant vectors), wrk drives:
  - single-text requests (POST /embed {"inputs": "<short text>"}) at a fixed concurrency: req/s, p50/p99;
  - batches of 32 and 256 short texts, POST /embed (JSON) and POST /v1/embeddings (base64): sentences/s;
  - batches of 256 as int8 and binary vectors (POST /embed's embedding_type): their cost per vector over float;
  - TEI's gRPC API (SEMBED_GRPC_PORT) beside it: single-text Embed calls, and EmbedStream streams of 256 texts
    (what tei-client sends for a batch), driven by grpc.aio client processes (wrk speaks no gRPC);
and the server's CPU time per request and per sentence is read from /proc (utime + stime of the
supervisor and every process under it, before and after each phase), with each process's share of
it and each API worker's RSS. The load generator is several wrk processes (C, epoll, a few % of a
core at these rates); its own CPU share of the machine is printed beside each phase, so a run where
it starved the server shows. Then malformed bodies (deep nesting, huge integer literals, invalid
UTF-8, truncated JSON, wrong types, too large) go to every JSON route: each must answer 4xx.
PASS/FAIL lines for the targets of issue 19, part 3.

    python -m benchmarks.frontend [--model-dir models/all-MiniLM-L6-v2] [--workers 1,2,4] [--duration 8]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks import machine
from benchmarks.machine import cpu_seconds, process_tree
from benchmarks.serving import make_texts
from service.hardware import cpu_flags

CORES = os.cpu_count() or 1
TARGET_SINGLE_US, TARGET_JSON_US, TARGET_BASE64_US = 300, 25, 15
TARGET_SHARE, TARGET_RSS_MB = 0.60, 150
#: API-process CPU per vector that int8 or binary output (embedding_type) may add over float's JSON
TARGET_OUTPUT_TYPE_US = 1.0

# wrk posts the JSON bodies of a file (one a line) in turn. done() prints the totals and the latency
# histogram (distinct microsecond values and their counts), so several wrk processes merge exactly.
WRK_SCRIPT = r"""
local requests, n = {}, 0
function init(args)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  for line in io.lines(os.getenv("BENCH_BODIES")) do requests[#requests + 1] = wrk.format(nil, nil, nil, line) end
end
function request()
  n = n % #requests + 1
  return requests[n]
end
function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format("TOTAL %d %d %d %d\n", summary.duration, summary.requests, e.status,
                         e.connect + e.read + e.write + e.timeout))
  for i = 1, #latency do
    local value, count = latency(i)
    io.write(string.format("LAT %d %d\n", value, count))
  end
end
"""


# --- the machine ---------------------------------------------------------------------------------
def simd_flags() -> str:
    """avx2 and every avx512* flag the CPU reports: JSON parsing and tokenisation speeds move with them."""
    flags = cpu_flags()
    if flags is None:
        return "unknown"
    return " ".join(sorted(f for f in flags if f == "avx2" or f.startswith("avx512"))) or "no avx2/avx512"


def locate_wrk() -> str:
    """wrk's path; installed from Debian's package when missing and we are root (as `make wordnet` does)."""
    found = shutil.which("wrk")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run("apt-get update -qq && apt-get install -y -qq wrk >/dev/null", shell=True, check=True)
        found = shutil.which("wrk")
    if found is None:
        sys.exit("wrk not found: sudo apt-get install wrk (or brew install wrk)")
    return found


# --- the texts -----------------------------------------------------------------------------------
def short_texts(tokenizer, data_dir: Path, n: int = 2048) -> list[str]:
    """Distinct STS-B sentences of 10-14 tokens (the serving bench's "short"), in a fixed shuffled order;
    without the data folder, the serving bench's own pick (generated sentences)."""
    sts = data_dir / "senteval" / "STS" / "STSBenchmark" / "sts-train.csv"
    if sts.is_file():
        rows = [line.split("\t") for line in sts.read_text(encoding="utf-8").splitlines()]
        sentences = list(dict.fromkeys(s for r in rows if len(r) >= 7 for s in r[5:7]))
        lengths = [len(e.ids) for e in tokenizer.encode_batch(sentences)]
        texts = [s for s, k in zip(sentences, lengths) if 10 <= k <= 14][:n]
    else:
        texts, _ = make_texts(tokenizer, data_dir, n, 1)
    random.Random(0).shuffle(texts)
    return texts


# --- the service's processes ---------------------------------------------------------------------
def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def api_workers(root: int) -> dict[int, str]:
    return {pid: t for pid, t in process_tree(root).items() if t.startswith("sembed: api ")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Service:
    proc: subprocess.Popen
    port: int
    grpc_port: int = 0  # SEMBED_GRPC_PORT; 0: off


@contextmanager
def running_service(export_dir: Path, workers: int, backend: str = "null", timeout: float = 120, **settings: str):
    """A fresh `python -m service` on a free port, ready on every API worker; stopped (SIGTERM) after.
    `settings`: more SEMBED_* variables (device="cuda" → SEMBED_DEVICE=cuda)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="sembed-frontend-") as tmp:
        # wrk sends the same bodies again and again: the vector cache off, every request pays its tokenising and
        # the engine's round trip, which is what this measures (the cache's own bench: benchmarks/serving.py)
        env = {**os.environ, "SEMBED_CACHE_MB": "0", **{f"SEMBED_{k.upper()}": v for k, v in settings.items()},
               "SEMBED_BACKEND": backend, "SEMBED_MODEL_DIR": str(export_dir),
               "SEMBED_API_WORKERS": str(workers), "SEMBED_HOST": "127.0.0.1", "SEMBED_PORT": str(port),
               "SEMBED_ACCESS_LOG": "false", "SEMBED_INDEX_PATH": f"{tmp}/index", "SEMBED_DRAIN_DELAY_S": "0"}
        # The log goes to a file: a pipe nobody reads fills up and stalls the service.
        with open(f"{tmp}/service.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "service"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(proc, port, workers, timeout, Path(f"{tmp}/service.log"))
            yield Service(proc, port, int(settings.get("grpc_port", 0)))
        finally:
            machine.stop(proc)


@contextmanager
def framework_floor(timeout: float = 60):
    """benchmarks/floor_app.py (a bare FastAPI route on the service's stack) under uvicorn on a free port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "benchmarks.floor_app:app", "--port", str(port),
                             "--log-level", "warning", "--no-access-log", "--http", "httptools", "--loop", "uvloop"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while request(port, "GET", "/readyz", None, timeout=2) != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the framework-floor app did not start")
            time.sleep(0.2)
        yield Service(proc, port)
    finally:
        machine.stop(proc)


async def grpc_floor_server(port: int) -> None:
    """A bare grpc.aio server answering TEI's Embed and EmbedStream with a constant 384-d vector: no parsing, no
    tokenizer, no engine, only what grpcio itself costs a call and a streamed message."""
    import grpc

    from service.api.grpc import tei_pb2

    answer = tei_pb2.EmbedResponse(embeddings=[0.05] * 384).SerializeToString()

    async def unary(_request: bytes, _context) -> bytes:
        return answer

    async def stream(requests, context):
        async for _ in requests:
            yield answer

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("tei.v1.Embed", {
        "Embed": grpc.unary_unary_rpc_method_handler(unary),
        "EmbedStream": grpc.stream_stream_rpc_method_handler(stream)})])
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


@contextmanager
def grpc_floor(timeout: float = 60):
    """grpc_floor_server on uvloop, as the API processes run, on a free port."""
    import grpc

    port = free_port()
    server = grpc_floor_server.__name__
    code = f"import uvloop; from benchmarks.frontend import {server}; uvloop.run({server}({port}))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        yield Service(proc, 0, port)
    finally:
        machine.stop(proc)


def wait_ready(proc: subprocess.Popen, port: int, workers: int, timeout: float, log: Path) -> None:
    """All `workers` API processes started, and /readyz 200 on enough fresh connections in a row that
    the kernel has handed some to each of them."""
    deadline, streak = time.monotonic() + timeout, 0
    while streak < 4 * workers:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the service was not ready in {timeout:.0f} s: {log.read_text()[-3000:]}")
        ok = len(api_workers(proc.pid)) == workers and request(port, "GET", "/readyz", None, timeout=2) == 200
        streak = streak + 1 if ok else 0
        if not ok:
            time.sleep(0.2)


def request(port: int, method: str, path: str, body: bytes | None, timeout: float = 30) -> int | None:
    """One request on a fresh connection: its status, or None if the connection failed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


# --- load ----------------------------------------------------------------------------------------
def percentile(histogram: dict[int, int], q: float) -> float:
    """The q-quantile of a {microseconds: count} histogram, in microseconds."""
    total, seen = sum(histogram.values()), 0
    for value in sorted(histogram):
        seen += histogram[value]
        if seen >= q * total:
            return float(value)
    return float("nan")


def load_phase(wrk: str, service: Service, path: str, bodies: list[bytes], *, connections: int, clients: int,
               duration: float, sentences_per_request: int = 1) -> dict:
    """wrk (`clients` processes, `connections` in all) posts `bodies` to `path` for `duration` seconds (a path
    "grpc:<method>": grpc_client processes call it on the gRPC port instead, with serialised messages as `bodies`);
    the server's CPU time over the phase, summed over its process tree and split by process."""
    with tempfile.TemporaryDirectory(prefix="sembed-wrk-") as tmp:
        script, body_file = Path(tmp, "post.lua"), Path(tmp, "bodies.jsonl")
        script.write_text(WRK_SCRIPT)
        body_file.write_bytes(b"\n".join(bodies) + b"\n")
        clients = max(1, min(clients, connections))
        per_client = [connections // clients + (i < connections % clients) for i in range(clients)]
        command = [wrk, "-t1", "-d", f"{duration:.0f}s", "--timeout", "10s", "-s", str(script)]
        url = f"http://127.0.0.1:{service.port}{path}"
        env = {**os.environ, "BENCH_BODIES": str(body_file)}

        tree = process_tree(service.proc.pid)
        before, client_before = cpu_seconds(tree), resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        if path.startswith("grpc:"):
            outputs, procs = grpc_load(service, path.removeprefix("grpc:"), bodies, per_client, duration,
                                       sentences_per_request)
        else:
            procs = [subprocess.Popen([*command, f"-c{c}", url], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for c in per_client]
            outputs = [p.communicate() for p in procs]  # waited for: their CPU lands in RUSAGE_CHILDREN
        wall = time.perf_counter() - start
        client_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        after_tree = process_tree(service.proc.pid)
        after = cpu_seconds(after_tree)

    histogram: dict[int, int] = {}
    requests = status_errors = socket_errors = 0
    load_s = 0.0  # wrk's own measure of its load time: the wall time also holds its start and exit
    for (out, err), p in zip(outputs, procs):
        if p.returncode != 0 or "TOTAL" not in out:
            raise RuntimeError(f"wrk failed ({p.returncode}): {err or out}")
        for line in out.splitlines():
            kind, *numbers = line.split()
            if kind == "TOTAL":
                load_s = max(load_s, int(numbers[0]) / 1e6)
                requests += int(numbers[1])
                status_errors += int(numbers[2])
                socket_errors += int(numbers[3])
            elif kind == "LAT":
                histogram[int(numbers[0])] = histogram.get(int(numbers[0]), 0) + int(numbers[1])
    titles = {**tree, **after_tree}
    per_process = {pid: after[pid] - before.get(pid, 0.0) for pid in after}  # a process born meanwhile: all of it
    server_cpu = sum(per_process.values())
    client_cpu = (client_after.ru_utime + client_after.ru_stime) - (client_before.ru_utime + client_before.ru_stime)
    sentences = requests * sentences_per_request
    return {
        "path": path, "connections": connections, "clients": clients, "wall_s": wall, "load_s": load_s,
        "requests": requests, "non_2xx": status_errors, "socket_errors": socket_errors,
        "req_s": requests / load_s, "sent_s": sentences / load_s,
        "p50_ms": percentile(histogram, 0.50) / 1000, "p99_ms": percentile(histogram, 0.99) / 1000,
        "server_cpu_s": server_cpu,
        "server_us_per_request": 1e6 * server_cpu / max(requests, 1),
        "server_us_per_sentence": 1e6 * server_cpu / max(sentences, 1),
        "server_machine_share": server_cpu / wall / CORES, "client_machine_share": client_cpu / wall / CORES,
        # by title: a restarted process's successor adds up under the same name
        "process_share": share_by_title(per_process, titles, server_cpu),
        "processes_changed": set(tree) != set(after_tree),
    }


def grpc_load(service: Service, method: str, bodies: list[bytes], per_client: list[int], duration: float,
              per_request: int) -> tuple[list[tuple[str, str]], list]:
    """`method` called on the service's gRPC port by one grpc_client process per entry of `per_client` (that many
    calls in flight each) for `duration` seconds; their outputs in wrk's format, and the processes (returncode 0)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    target = f"127.0.0.1:{service.grpc_port}"
    with context.Pool(len(per_client)) as pool:  # joined on exit: their CPU lands in RUSAGE_CHILDREN
        outputs = pool.starmap(grpc_client, [(target, method, bodies, c, duration, per_request) for c in per_client])
        pool.close()
        pool.join()
    return [(out, "") for out in outputs], [argparse.Namespace(returncode=0) for _ in outputs]


def grpc_client(target: str, method: str, bodies: list[bytes], concurrency: int, duration: float,
                per_request: int) -> str:
    """One load process: `concurrency` calls in flight on one channel, each a unary call with the next body, or a
    stream of the next `per_request` bodies (its answers all read); wrk's TOTAL and LAT lines."""
    import asyncio

    import grpc

    async def run() -> str:
        latencies: dict[int, int] = {}
        counts = {"requests": 0, "errors": 0, "next": 0}
        async with grpc.aio.insecure_channel(target) as channel:
            unary = channel.unary_unary(method)
            stream = channel.stream_stream(method)
            deadline = time.perf_counter() + duration

            def take() -> list[bytes]:
                start = counts["next"]
                counts["next"] += per_request
                return [bodies[(start + i) % len(bodies)] for i in range(per_request)]

            async def loop() -> None:
                while time.perf_counter() < deadline:
                    messages, start = take(), time.perf_counter()
                    try:
                        if per_request == 1 and not method.endswith("Stream"):
                            await unary(messages[0])
                        else:
                            answers = [answer async for answer in stream(iter(messages))]
                            assert len(answers) == len(messages)
                    except grpc.aio.AioRpcError:
                        counts["errors"] += 1
                        continue
                    us = int((time.perf_counter() - start) * 1e6)
                    latencies[us] = latencies.get(us, 0) + 1
                    counts["requests"] += 1

            began = time.perf_counter()
            await asyncio.gather(*(loop() for _ in range(concurrency)))
            elapsed = time.perf_counter() - began
        lines = [f"TOTAL {int(elapsed * 1e6)} {counts['requests']} {counts['errors']} 0"]
        return "\n".join(lines + [f"LAT {us} {n}" for us, n in latencies.items()])

    return asyncio.run(run())


def grpc_bodies(texts: list[str]) -> list[bytes]:
    """Serialised TEI EmbedRequest messages of one text each."""
    from service.api.grpc import tei_pb2

    return [tei_pb2.EmbedRequest(inputs=t).SerializeToString() for t in texts]


def share_by_title(per_process: dict[int, float], titles: dict[int, str], total: float) -> dict[str, float]:
    shares: dict[str, float] = {}
    for pid, seconds in per_process.items():
        title = titles.get(pid) or str(pid)
        shares[title] = shares.get(title, 0.0) + seconds / max(total, 1e-9)
    return dict(sorted(shares.items(), key=lambda kv: -kv[1]))


def single_bodies(texts: list[str]) -> list[bytes]:
    """POST /embed bodies of one text each."""
    return [json.dumps({"inputs": t}).encode() for t in texts]


def phases(texts: list[str], concurrency: int, batch_concurrency: int,
           int8: bool = True) -> list[tuple[str, str, list[bytes], int, int]]:
    """(name, path, bodies, sentences per request, connections) of each load phase, in the order run; int8 output
    only for an export that carries its calibration ranges."""
    def batches(size: int, openai: bool, embedding_type: str = "float") -> list[bytes]:
        rows = [[texts[(start + i) % len(texts)] for i in range(size)] for start in range(0, 64 * size, size)]
        if openai:
            return [json.dumps({"input": r, "encoding_format": "base64"}).encode() for r in rows]
        typed = {"embedding_type": embedding_type} if embedding_type != "float" else {}
        return [json.dumps({"inputs": r, **typed}).encode() for r in rows]

    return [("singles", "/embed", single_bodies(texts), 1, concurrency),
            ("batch32 json", "/embed", batches(32, False), 32, batch_concurrency),
            ("batch32 base64", "/v1/embeddings", batches(32, True), 32, batch_concurrency),
            ("batch256 json", "/embed", batches(256, False), 256, batch_concurrency),
            ("batch256 base64", "/v1/embeddings", batches(256, True), 256, batch_concurrency),
            # output types (service/api/output_types.py) over batch256 json's float
            *([("batch256 int8", "/embed", batches(256, False, "int8"), 256, batch_concurrency)] if int8 else []),
            ("batch256 binary", "/embed", batches(256, False, "binary"), 256, batch_concurrency),
            # TEI's gRPC API: one text a call, and a stream of 256 texts (tei-client's batch)
            ("grpc singles", "grpc:/tei.v1.Embed/Embed", grpc_bodies(texts), 1, concurrency),
            ("grpc stream256", "grpc:/tei.v1.Embed/EmbedStream", grpc_bodies(texts), 256, batch_concurrency)]


def calibrated(export_dir: Path) -> bool:
    """Whether the export carries int8 / uint8 output's calibration ranges (exports before them do not)."""
    return bool(json.loads((export_dir / "manifest.json").read_text()).get("calibration"))


# --- malformed bodies ----------------------------------------------------------------------------
MALFORMED_PATHS = ("/embed", "/v1/embeddings", "/search", "/")


def malformed_bodies(max_bytes: int = 2_000_000) -> dict[str, bytes]:
    """Bodies a parser or a validator must refuse without a 500, however deep or large. The deepest
    stays within the 2 MB body limit, so it reaches the JSON parser rather than the 413."""
    deepest = (max_bytes - 64) // 2
    return {
        "arrays 100k deep": b"[" * 100_000 + b"]" * 100_000,
        f"arrays {deepest // 1000}k deep in inputs": b'{"inputs": ' + b"[" * deepest + b"]" * deepest + b"}",
        "objects 100k deep": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        "integer of 10k digits": b'{"inputs": "a", "input": "a", "query": "a", "k": ' + b"9" * 10_000 + b"}",
        "integer of 10k digits in a list": b'{"inputs": [' + b"1" * 10_000 + b'], "input": [' + b"1" * 10_000 + b"]}",
        "invalid UTF-8": b'{"inputs": "caf\xc3\x28 \xff\xfe", "input": "\xff", "query": "\xff"}',
        "lone surrogate": b'{"inputs": "\\ud800", "input": "\\ud800", "query": "\\ud800"}',
        "truncated JSON": b'{"inputs": ["a sentence", "another',
        "NaN and Infinity": b'{"inputs": NaN, "input": Infinity, "query": -Infinity, "k": NaN}',
        "wrong types": b'{"inputs": {"x": 1}, "input": 3.5, "query": ["a"], "k": "ten"}',
        "a bare string": b'"just a string"',
        "null": b"null",
        "empty body": b"",
        "over the size limit": b'{"inputs": "' + b"a" * (max_bytes + 1000) + b'"}',
    }


def check_malformed(port: int, max_bytes: int = 2_000_000) -> list[dict]:
    """Each malformed body to each JSON route: the status (None: no answer at all)."""
    return [{"path": path, "body": name, "status": request(port, "POST", path, body, timeout=60)}
            for name, body in malformed_bodies(max_bytes).items() for path in MALFORMED_PATHS]


# --- the run -------------------------------------------------------------------------------------
def bench_workers(wrk: str, export_dir: Path, workers: int, texts: list[str], args, *, malformed: bool = False,
                  backend: str = "null", label: str | None = None, **settings: str) -> dict:
    """Every load phase against one fresh service with `workers` API processes; their RSS at the end;
    the malformed bodies' statuses if asked."""
    out: dict = {"phases": {}}
    plan = phases(texts, args.concurrency, args.batch_concurrency, int8=calibrated(export_dir))
    with running_service(export_dir, workers, backend, **{"grpc_port": str(free_port()), **settings}) as service:
        _, path, bodies, _, connections = plan[0]  # warm-up: lazy imports, caches, connection pools
        load_phase(wrk, service, path, bodies, connections=connections, clients=args.clients,
                   duration=max(1.0, args.duration / 4))
        for name, path, bodies, per_request, connections in plan:
            out["phases"][name] = load_phase(wrk, service, path, bodies, connections=connections, clients=args.clients,
                                             duration=args.duration, sentences_per_request=per_request)
            print(row(label or workers, name, out["phases"][name]), flush=True)
        out["rss_mb"] = {title: rss_mb(pid) for pid, title in sorted(api_workers(service.proc.pid).items())}
        if malformed:
            out["malformed"] = check_malformed(service.port)
    return out


HEADER = (f"{'workers':>7}  {'phase':<16}{'conn':>5}{'req/s':>9}{'sent/s':>10}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'non2xx':>7}{'µs/req':>8}{'µs/sent':>8}{'server':>8}{'client':>8}  busiest process")


def row(workers: int | str, name: str, p: dict) -> str:
    title, share = next(iter(p["process_share"].items()))
    return (f"{workers:>7}  {name:<16}{p['connections']:>5}{p['req_s']:>9,.0f}{p['sent_s']:>10,.0f}"
            f"{p['p50_ms']:>8.1f}{p['p99_ms']:>8.1f}{p['non_2xx'] + p['socket_errors']:>7}"
            f"{p['server_us_per_request']:>8.0f}{p['server_us_per_sentence']:>8.1f}"
            f"{p['server_machine_share']:>8.0%}{p['client_machine_share']:>8.0%}  {title} {share:.0%}")


def checks(runs: dict[int, dict], malformed: list[dict] | None,
           grpc_floors: dict[str, dict] | None = None) -> list[tuple[str, bool]]:
    """PASS/FAIL lines; the gRPC ones name grpcio's floor (grpc_floor) beside HTTP's figure, where it was measured:
    what the bare server costs a call or a streamed message bounds what the service's gRPC paths can reach."""
    out = []
    for workers, run in runs.items():
        p = run["phases"]
        us = p["singles"]["server_us_per_request"]
        out.append((f"{workers} API worker(s): {us:.0f} µs server CPU per single-text request "
                    f"(target ≤ {TARGET_SINGLE_US})", us <= TARGET_SINGLE_US))
        for name, target in (("batch256 json", TARGET_JSON_US), ("batch256 base64", TARGET_BASE64_US)):
            us = p[name]["server_us_per_sentence"]
            out.append((f"{workers} API worker(s): {us:.1f} µs server CPU per sentence, {name} (target ≤ {target})",
                        us <= target))
        for name in ("batch256 int8", "batch256 binary"):
            if name not in p:
                out.append((f"{workers} API worker(s): {name} not run: the export carries no calibration ranges "
                            "(re-export it)", False))
                continue
            over = p[name]["server_us_per_sentence"] - p["batch256 json"]["server_us_per_sentence"]
            out.append((f"{workers} API worker(s): {name} output costs {over:+.2f} µs server CPU per vector over "
                        f"float (target ≤ {TARGET_OUTPUT_TYPE_US:g})", over <= TARGET_OUTPUT_TYPE_US))
        for name, over_http, unit, floor_phase in (("grpc singles", "singles", "request", "singles"),
                                                   ("grpc stream256", "batch256 json", "sentence", "stream256")):
            us, http_us = p[name][f"server_us_per_{unit}"], p[over_http][f"server_us_per_{unit}"]
            floor = (f"; grpcio's bare floor: {grpc_floors[floor_phase][f'server_us_per_{unit}']:.1f}"
                     if grpc_floors else "")
            out.append((f"{workers} API worker(s): {name}: {us:.1f} µs server CPU per {unit} against HTTP's "
                        f"{http_us:.1f} ({over_http}; target: no more{floor})", us <= http_us))
        worst = max(run["rss_mb"].values())
        out.append((f"{workers} API worker(s): largest API-worker RSS {worst:.0f} MB (target ≤ {TARGET_RSS_MB})",
                    worst <= TARGET_RSS_MB))
        if any(q["non_2xx"] or q["socket_errors"] for q in p.values()):
            out.append((f"{workers} API worker(s): every load request answered 2xx", False))
    if 2 in runs:
        title, share = next(iter(runs[2]["phases"]["singles"]["process_share"].items()))
        out.append((f"2 API workers, single-text load: the busiest process ({title}) does {share:.0%} of the "
                    f"server's CPU work (target ≤ {TARGET_SHARE:.0%})", share <= TARGET_SHARE))
    else:
        out.append(("2 API workers not run: the work's spread not measured", False))
    if malformed is not None:
        bad = [m for m in malformed if m["status"] is None or not 400 <= m["status"] < 500]
        out.append((f"every malformed body answers 4xx ({len(malformed) - len(bad)}/{len(malformed)})"
                    + "".join(f"\n      {m['path']} {m['body']}: {m['status']}" for m in bad), not bad))
    return out


# --- on a GPU: the real model, the service against onnxruntime in process --------------------------------
TARGET_GPU_RATIO, TARGET_GPU_SINGLES, TARGET_GPU_P99_MS, TARGET_FP16 = 0.9, 5000, 50, 1.5


def cuda_available() -> bool:
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


def in_process_rate(export_dir: Path, texts: list[str], batch: int, variant: str, seconds: float) -> float:
    """Sentences/s of onnxruntime on CUDA in this process, as a user's script gets it: tokenise a batch,
    pad it, run it (the service's own backend, so the same graph, IO binding and provider options)."""
    from service.engine.backends.onnx import OnnxBackend

    backend = OnnxBackend(export_dir, device="cuda", variant=variant)
    backend.warmup()
    batches = [texts[i:i + batch] for i in range(0, len(texts) - batch + 1, batch)]
    for chunk in batches:  # every padded length this run meets, before the clock starts
        backend.encode(chunk, batch_size=batch)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for chunk in batches:
            backend.encode(chunk, batch_size=batch)
            done += len(chunk)
    return done / (time.perf_counter() - start)


def model_rate(export_dir: Path, variant: str, rows: int = 256, length: int = 128, seconds: float = 3.0) -> float:
    """Sentences/s of the graph alone on CUDA: padded token ids in, vectors out, nothing on the host
    between passes but IO binding. What fp16 changes is the device's arithmetic, which short texts hide
    behind the host's work; 128-token rows show it."""
    import numpy as np

    from service.engine.backends.onnx import OnnxBackend
    from service.ipc.messages import TokenBatch

    backend = OnnxBackend(export_dir, device="cuda", variant=variant, pad_to_multiple_of=8)
    items = TokenBatch.from_rows(np.random.default_rng(0).integers(1000, 29000, (rows, length)).tolist())
    for _ in range(3):
        backend.run(items, length)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        backend.run(items, length)
        done += rows
    return done / (time.perf_counter() - start)


def shape_costs(export_dir: Path, variant: str, device: str = "cuda", passes: int = 80, max_rows: int = 256) -> dict:
    """Milliseconds per pass of short rows (14 tokens, padded to 16), each pass a row count drawn from 1..max_rows
    as single-text load makes them, with the CUDA row buckets on and off; then the first 20 shapes once more. A
    kernel that plans once per input shape shows as new shapes costing more than seen ones."""
    import numpy as np

    from service.engine.backends.onnx import OnnxBackend
    from service.ipc.messages import TokenBatch

    counts = [int(r) for r in np.random.default_rng(0).integers(1, max_rows + 1, passes)]
    out = {}
    for buckets in (False, True):
        backend = OnnxBackend(export_dir, device=device, variant=variant, row_buckets=buckets, pad_to_multiple_of=8)
        backend.warmup()
        times = []
        for rows in counts + counts[:20]:
            items = TokenBatch.from_rows(np.random.default_rng(rows).integers(1000, 29000, (rows, 14)).tolist())
            start = time.perf_counter()
            backend.run(items, 16)
            times.append((time.perf_counter() - start) * 1e3)
        out["row buckets" if buckets else "no row buckets"] = {
            "median_ms": float(np.median(times[:passes])), "max_ms": max(times[:passes]),
            "seen_again_ms": float(np.mean(times[passes:]))}
    return out


def bench_gpu(wrk: str, export_dir: Path, texts: list[str], args) -> dict:
    """fp32 and fp16 in process at batch 32 and 256, then the service on CUDA under the same load phases."""
    from service.manifest import Manifest

    variants = ["fp32"] + (["fp16"] if "fp16" in (Manifest.load(export_dir).variants or {}) else [])
    out: dict = {"variants": variants, "in_process": {}, "model_only": {}, "shapes": {}, "service": {}}
    for variant in variants:
        out["shapes"][variant] = shape_costs(export_dir, variant)
        for mode, t in out["shapes"][variant].items():
            print(f"{variant}, {mode}: 80 passes of 1-256 short rows, each a random count: median {t['median_ms']:.1f} "
                  f"ms, max {t['max_ms']:.1f}; 20 of those shapes again: {t['seen_again_ms']:.1f} ms", flush=True)
    for variant in variants:
        out["model_only"][variant] = model_rate(export_dir, variant)
        print(f"the graph alone on CUDA, {variant}, 256 rows of 128 tokens: {out['model_only'][variant]:,.0f} "
              "sentences/s", flush=True)
    for variant in variants:
        for batch in (32, 256):
            rate = in_process_rate(export_dir, texts, batch, variant, args.duration)
            out["in_process"][f"{variant} batch{batch}"] = rate
            print(f"in process, onnxruntime CUDA {variant}, batch {batch}: {rate:,.0f} sentences/s", flush=True)
    gpu_args = argparse.Namespace(**{**vars(args), "concurrency": args.gpu_concurrency})
    print(HEADER, flush=True)
    for variant in variants:
        out["service"][variant] = bench_workers(wrk, export_dir, args.gpu_workers, texts, gpu_args, backend="onnx",
                                                label=f"{variant}:{args.gpu_workers}", device="cuda", variant=variant)
    return out


def gpu_checks(gpu: dict) -> list[tuple[str, bool]]:
    out = []
    fp32 = gpu["service"]["fp32"]["phases"]
    for batch in (32, 256):
        base = gpu["in_process"][f"fp32 batch{batch}"]
        best = max(("json", "base64"), key=lambda f: fp32[f"batch{batch} {f}"]["sent_s"])
        ratio = fp32[f"batch{batch} {best}"]["sent_s"] / base
        out.append((f"GPU: service ≥ {TARGET_GPU_RATIO}× in-process onnxruntime CUDA at batch {batch} "
                    f"({ratio:.2f}×, {best}; JSON {fp32[f'batch{batch} json']['sent_s'] / base:.2f}×)",
                    ratio >= TARGET_GPU_RATIO))
    singles = fp32["singles"]
    out.append((f"GPU: single-text requests ≥ {TARGET_GPU_SINGLES:,} req/s with p99 ≤ {TARGET_GPU_P99_MS} ms at "
                f"concurrency {singles['connections']} ({singles['req_s']:,.0f} req/s, p99 {singles['p99_ms']:.1f} ms)",
                singles["req_s"] >= TARGET_GPU_SINGLES and singles["p99_ms"] <= TARGET_GPU_P99_MS))
    if "fp16" in gpu["variants"]:
        speedup = gpu["model_only"]["fp16"] / gpu["model_only"]["fp32"]
        short = gpu["in_process"]["fp16 batch256"] / gpu["in_process"]["fp32 batch256"]
        out.append((f"GPU: fp16 ≥ {TARGET_FP16}× fp32 at batch 256 (the graph, 128-token rows), its quality gate "
                    f"passed at export ({speedup:.2f}×; short texts end to end in process {short:.2f}×)",
                    speedup >= TARGET_FP16))
    else:
        out.append(("GPU: the export has no fp16 variant (left out, or its gate failed): fp16 not measured", False))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path("models/all-MiniLM-L6-v2"),
                        help="an export: its tokenizer and dimension are served, not its model")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"), help="real sentences, if there")
    parser.add_argument("--workers", default="1,2,4", help="API worker counts, one fresh service each")
    parser.add_argument("--duration", type=float, default=8, help="seconds per load phase")
    parser.add_argument("--concurrency", type=int, default=64, help="connections for single-text requests")
    parser.add_argument("--batch-concurrency", type=int, default=16, help="connections for batch requests")
    parser.add_argument("--clients", type=int, default=min(4, CORES), help="wrk processes")
    parser.add_argument("--no-malformed", dest="malformed", action="store_false")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here as JSON")
    parser.add_argument("--gpu", choices=("auto", "on", "off"), default="auto",
                        help="the real model on CUDA against onnxruntime in process (auto: where onnxruntime has CUDA)")
    parser.add_argument("--gpu-workers", type=int, default=min(8, max(1, CORES // 2)), help="API workers on a GPU")
    parser.add_argument("--gpu-concurrency", type=int, default=256, help="connections, single-text requests, GPU")
    args = parser.parse_args(argv)

    from tokenizers import Tokenizer

    wrk = locate_wrk()
    print(machine.cpu_line())
    print(f"SIMD flags: {simd_flags()}")
    print(f"load: {subprocess.run([wrk, '--version'], capture_output=True, text=True).stdout.splitlines()[0]}; "
          f"{args.clients} wrk processes; {args.duration:.0f} s per phase; SEMBED_BACKEND=null on {args.model_dir}")
    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    tokenizer.no_padding()  # an export's tokenizer.json may pad every text to max_seq_length
    texts = short_texts(tokenizer, args.data_dir)
    print(f"texts: {len(texts)} short (10-14 tokens); server and client CPU as a share of all {CORES} cores\n")
    print(HEADER, flush=True)
    runs = {}
    for i, workers in enumerate(int(w) for w in args.workers.split(",")):  # malformed bodies: once, on the first
        runs[workers] = bench_workers(wrk, args.model_dir, workers, texts, args, malformed=args.malformed and i == 0)
    print("\nserver CPU by process under single-text load:")
    for workers, run in runs.items():
        shares = run["phases"]["singles"]["process_share"]
        print(f"  {workers} API worker(s): " + ", ".join(f"{t} {s:.0%}" for t, s in shares.items() if s >= 0.005))
    with framework_floor() as floor_app:
        floor = load_phase(wrk, floor_app, "/embed", single_bodies(texts), connections=args.concurrency,
                           clients=args.clients, duration=args.duration)
    print(f"the framework's floor (benchmarks/floor_app.py: one bare FastAPI route on the same uvicorn, httptools, "
          f"uvloop, pydantic and orjson, no tokenizer, no engine): {floor['server_us_per_request']:.0f} µs CPU per "
          f"single-text request at {floor['req_s']:,.0f} req/s")
    with grpc_floor() as floor_server:
        bodies = grpc_bodies(texts)
        grpc_floors = {name: load_phase(wrk, floor_server, path, bodies, connections=connections, clients=args.clients,
                                        duration=args.duration, sentences_per_request=per_request)
                       for name, path, per_request, connections in (
                           ("singles", "grpc:/tei.v1.Embed/Embed", 1, args.concurrency),
                           ("stream256", "grpc:/tei.v1.Embed/EmbedStream", 256, args.batch_concurrency))}
    print(f"grpcio's floor (a bare grpc.aio server on uvloop answering Embed with a constant vector): "
          f"{grpc_floors['singles']['server_us_per_request']:.0f} µs CPU per call, "
          f"{grpc_floors['stream256']['server_us_per_sentence']:.0f} µs per streamed message")
    print("API-worker RSS after the load (MB):")
    for workers, run in runs.items():
        print(f"  {workers} API worker(s): " + ", ".join(f"{t}: {mb:.0f}" for t, mb in run["rss_mb"].items()))
    gpu = None
    if args.gpu == "on" or (args.gpu == "auto" and cuda_available()):
        print("\nthe real model on CUDA:")
        gpu = bench_gpu(wrk, args.model_dir, texts, args)
    malformed = next((run.pop("malformed") for run in runs.values() if "malformed" in run), None)
    if malformed is not None:
        statuses = {}
        for m in malformed:
            statuses.setdefault(m["body"], []).append(m["status"])
        print(f"malformed bodies (status from {', '.join(MALFORMED_PATHS)}):")
        for name, got in statuses.items():
            print(f"  {name:<36} {' '.join(str(s) for s in got)}")
    print()
    results = {"cpu": machine.cpu_line(), "simd_flags": simd_flags(), "cores": CORES,
               "settings": vars(args),
               "runs": runs, "framework_floor": floor, "grpc_floor": grpc_floors, "malformed": malformed, "gpu": gpu}
    if gpu is None:
        print("NOT MEASURED  the GPU targets (service vs in-process onnxruntime CUDA, singles at concurrency 256, "
              "fp16 vs fp32): no CUDA device here")
    return machine.finish(checks(runs, malformed, grpc_floors) + (gpu_checks(gpu) if gpu else []), results,
                          args.out)


if __name__ == "__main__":
    sys.exit(main())
