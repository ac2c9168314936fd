"""`make bench-peers`: our service against the servers a user would pick instead, serving the same model.

The contenders, one up at a time on a loopback port, each answering OpenAI's POST /v1/embeddings:
  - sembed: `python -m service` with the export (fp32, every setting at its default but the vector cache, off:
    the load repeats its texts, and Infinity's own cache is off by default);
  - infinity-onnx: Infinity (infinity-emb, .venv/peers) with its ONNX engine (optimum), the hub-style directory
    benchmarks/peers_prepare.py builds, `--pooling-method mean` (its default for this model is CLS pooling,
    which gives vectors of cosine 0.5-0.6 to the true ones), `--url-prefix /v1`, else its defaults;
  - infinity-torch: Infinity's torch engine (sentence-transformers underneath) on the model's directory;
  - sentence-transformers: benchmarks/peers_st_server.py, a FastAPI endpoint that encodes each request's texts.
Each is first checked: its vectors for short and long texts, one request of many and single-text requests,
against sentence-transformers' own (this environment's) by cosine; below MIN_COSINE its rows say FAIL and it is
not measured. Then the same load generator (a raw HTTP/1.1 keep-alive client on asyncio: its own CPU per
request is printed) drives it: single texts at concurrency 1 and 64, batches of 32 short texts and batches of 32
long texts (124-132 tokens) at --batch-concurrency, for --duration seconds each after a warm-up (requests in
flight then are waited for and counted). Per phase: sentences/s (per connection: its answers over its time to
the last one, summed), p50/p99 request latency, and the server's CPU time per sentence (utime + stime of its process and
every process under it, from /proc); a 429 with Retry-After is waited out and sent again, as a client would (its
latency runs from the first send; the count is shown), any other non-200 answer is counted as an error. Rounds
alternate the servers (each round in a rotated order), so the host's drift hits all of them; each figure is the
median of its rounds (every round is kept in the JSON).

    python -m benchmarks.peers [--model-dir models/all-MiniLM-L6-v2] [--data-dir ../shared/data]
        [--peers-python .venv/peers/bin/python] [--servers sembed,infinity-onnx,...] [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks import machine
from benchmarks.frontend import free_port
from benchmarks.machine import cpu_seconds, process_tree
from benchmarks.serving import Connection, make_texts

REPO = Path(__file__).resolve().parent.parent
SERVERS = ("sembed", "infinity-onnx", "infinity-torch", "sentence-transformers")
PATH = "/v1/embeddings"
MODEL_NAME = "all-MiniLM-L6-v2"
#: a server whose vectors fall below this cosine to sentence-transformers' is not measured
MIN_COSINE = 0.999
#: the targets of issue 39 against Infinity's better engine (per phase, in sentences/s); p99 at concurrency 64
TARGETS = {"c1": 1.5, "c64": 1.5, "batch32 short": 1.5, "batch32 long": 1.1}
BATCH = 32
#: how long a phase may run past its duration to see its fewest answers (a server slower than that has none)
MAX_EXTRA_S = 60


# --- the load ------------------------------------------------------------------------------------
@dataclass
class Phase:
    name: str
    bodies: list[bytes]  # posted in turn
    items: int  # texts per request
    concurrency: int


def phases(short: list[str], long: list[str], batch_concurrency: int) -> list[Phase]:
    def body(texts: list[str] | str) -> bytes:
        return json.dumps({"model": MODEL_NAME, "input": texts}).encode()

    def batches(texts: list[str]) -> list[bytes]:
        return [body([texts[(i + k) % len(texts)] for k in range(BATCH)]) for i in range(0, len(texts), BATCH)]

    singles = [body(t) for t in short]
    return [Phase("c1", singles, 1, 1), Phase("c64", singles, 1, 64),
            Phase("batch32 short", batches(short), BATCH, batch_concurrency),
            Phase("batch32 long", batches(long), BATCH, batch_concurrency)]


@dataclass
class Load:
    """What one phase's load saw: each answered request's (connection, sent, answered) time and status."""

    start: float
    answers: list[tuple[int, float, float, int]]
    retries: int = 0  # 429 answers with Retry-After, waited out and sent again
    first_error: str = ""

    def seconds(self) -> float:
        """The phase's measured time, per connection: each connection's requests answered 200 over its time from
        the start to its last answer, summed into a rate (a batch of long texts takes seconds: counted within a
        fixed window, the figure would move in steps of one request per connection). Returned as the time in
        which all the 200s fall at that rate."""
        done: dict[int, list[float]] = {}
        for conn, _, answered, status in self.answers:
            if status == 200:
                done.setdefault(conn, []).append(answered)
        rate = sum(len(times) / (max(times) - self.start) for times in done.values())
        good = sum(len(times) for times in done.values())
        return good / rate if rate else float("inf")


async def drive(port: int, phase: Phase, duration: float, min_requests: int = 0) -> Load:
    """`phase.concurrency` connections post `phase.bodies` in turn, each its next request as soon as the last is
    answered, for `duration` seconds after one warm-up request each, and on until `min_requests` were answered 200
    (a slow server still gets a figure); a request in flight when the time is up is waited for and counted."""
    conns = [await Connection(port).open() for _ in range(phase.concurrency)]
    bodies = phase.bodies
    await asyncio.gather(*(c.post(PATH, bodies[i % len(bodies)]) for i, c in enumerate(conns)))
    answers: list[tuple[int, float, float, int]] = []
    retries = [0]
    first_error = ""
    turn = answered = 0
    start = time.perf_counter()
    end = start + duration

    async def worker(i: int) -> None:
        nonlocal turn, answered, first_error
        while (sent := time.perf_counter()) < end or (answered < min_requests and sent < end + MAX_EXTRA_S):
            body = bodies[turn % len(bodies)]
            turn += 1
            while True:
                try:
                    status, answer = await conns[i].post(PATH, body)
                except (OSError, asyncio.IncompleteReadError) as e:  # the server closed the connection: an error
                    conns[i].close()
                    conns[i] = await Connection(port).open()
                    status, answer = 0, repr(e).encode()
                if status != 429 or conns[i].retry_after is None or time.perf_counter() > end + MAX_EXTRA_S:
                    break
                # refused for now with Retry-After (a server shedding load): as a client does, wait and send it
                # again; its latency runs from the first send
                retries[0] += 1
                await asyncio.sleep(conns[i].retry_after)
                conns[i].close()  # on a fresh connection: the server may close one idle that long (keep-alive)
                conns[i] = await Connection(port).open()
            answers.append((i, sent, time.perf_counter(), status))
            answered += status == 200
            if status != 200 and not first_error:
                first_error = f"{status}: {answer[:200].decode(errors='replace')}"

    try:
        await asyncio.gather(*(worker(i) for i in range(len(conns))))
    finally:
        for c in conns:
            c.close()
    return Load(start, answers, retries[0], first_error)


def measure(port: int, root_pid: int, phase: Phase, duration: float) -> dict:
    """One phase against the server whose processes are `root_pid` and its descendants."""
    pids = process_tree(root_pid)
    before, client_before = cpu_seconds(pids), time.process_time()
    load = asyncio.run(drive(port, phase, duration, min_requests=2 * phase.concurrency))
    client_s = time.process_time() - client_before
    after = cpu_seconds(process_tree(root_pid))
    server_s = sum(after[pid] - before.get(pid, 0.0) for pid in after)  # a process born meanwhile: all of it
    figures = summarize([done - sent for _, sent, done, status in load.answers if status == 200], phase.items,
                        load.seconds(), server_s, client_s, sum(status != 200 for *_, status in load.answers))
    figures["retried_429"] = load.retries
    if load.first_error:
        figures["first_error"] = load.first_error
    return figures


# --- the figures ---------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linearly interpolated between the two nearest ranks (numpy's default)."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def summarize(latencies: list[float], items_per_request: int, seconds: float, server_cpu_s: float,
              client_cpu_s: float, errors: int = 0) -> dict:
    """A phase's figures from the latencies (seconds) of its requests answered 200 in the `seconds` measured, the
    texts each carried, the CPU seconds the server and the load generator spent, and the requests that failed
    (their texts count for no throughput; the CPU they cost stays in the server's figure)."""
    requests = len(latencies)
    items = requests * items_per_request
    return {"requests": requests, "errors": errors, "sent_s": items / seconds, "req_s": requests / seconds,
            "p50_ms": 1000 * percentile(latencies, 50), "p99_ms": 1000 * percentile(latencies, 99),
            "server_cpu_ms_per_item": 1000 * server_cpu_s / items if items else float("inf"),
            "client_cpu_us_per_request": 1e6 * client_cpu_s / max(requests + errors, 1)}


def median_of_rounds(rounds: list[dict]) -> dict:
    """Each figure's median over the rounds (a phase's rounds carry the same keys)."""
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0] if key != "first_error"}


# --- the vectors ---------------------------------------------------------------------------------
def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two [n, d] arrays."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)).clip(1e-12)


async def fetch_vectors(port: int, texts: list[str], singles: int) -> np.ndarray:
    """The server's vectors of `texts`: all in one request, then the first `singles` again one per request (a
    server may batch them differently); the single ones are appended after the batch's."""
    conn = await Connection(port).open()
    try:
        rows = []
        for request in [texts, *texts[:singles]]:
            status, body = await conn.post(PATH, json.dumps({"model": MODEL_NAME, "input": request}).encode())
            if status != 200:
                raise RuntimeError(f"status {status}: {body[:300]!r}")
            data = sorted(json.loads(body)["data"], key=lambda d: d["index"])
            rows += [d["embedding"] for d in data]
        return np.asarray(rows, dtype=np.float64)
    finally:
        conn.close()


def check_vectors(port: int, texts: list[str], reference: np.ndarray, singles: int = 4) -> tuple[float, bool]:
    """(the lowest cosine of the server's vectors to `reference` (sentence-transformers' of `texts`), ok)."""
    got = asyncio.run(fetch_vectors(port, texts, singles))
    worst = float(cosines(got, np.concatenate([reference, reference[:singles]])).min())
    return worst, worst >= MIN_COSINE


def reference_vectors(st_dir: Path, texts: list[str]) -> np.ndarray:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(os.cpu_count() or 1)
    return SentenceTransformer(str(st_dir), device="cpu").encode(texts, normalize_embeddings=True)


# --- the servers ---------------------------------------------------------------------------------
@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = REPO


def launch(name: str, port: int, *, model_dir: Path, st_dir: Path, infinity_dir: Path, peers_python: Path) -> Launch:
    """How each contender is started on `port` (loopback only)."""
    if name == "sembed":
        return Launch([sys.executable, "-m", "service"],
                      {"SEMBED_MODEL_DIR": str(model_dir), "SEMBED_HOST": "127.0.0.1", "SEMBED_PORT": str(port),
                       # no vector cache: the load repeats its texts, and Infinity's cache is off by default
                       "SEMBED_CACHE_MB": "0",
                       # no index kept; no wait before draining at SIGTERM (neither touches a request's path)
                       "SEMBED_INDEX_PATH": ":memory:", "SEMBED_DRAIN_DELAY_S": "0"})
    if name.startswith("infinity-"):
        onnx = name == "infinity-onnx"
        # the ONNX engine starts in its directory, model id ".": see benchmarks/peers_prepare.py
        argv = [str(peers_python.parent / "infinity_emb"), "v2", "--model-id", "." if onnx else str(st_dir),
                "--served-model-name", MODEL_NAME, "--engine", "optimum" if onnx else "torch", "--device", "cpu",
                "--host", "127.0.0.1", "--port", str(port), "--url-prefix", "/v1"]
        if onnx:
            argv += ["--pooling-method", "mean"]
        env = {"HF_HOME": str(infinity_dir.parent / "hf-home"), "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1",
               "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
        return Launch(argv, env, infinity_dir if onnx else REPO)
    if name == "sentence-transformers":
        return Launch([str(peers_python), "-m", "uvicorn", "benchmarks.peers_st_server:app", "--host", "127.0.0.1",
                       "--port", str(port)], {"PEERS_ST_MODEL": str(st_dir)})
    raise ValueError(f"unknown server {name!r}; known: {', '.join(SERVERS)}")


@contextlib.contextmanager
def running(how: Launch, port: int, log: Path, timeout: float = 300) -> Iterator[subprocess.Popen]:
    """The server started, answering one text with 200; stopped (SIGTERM, then SIGKILL) after."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    with open(log, "wb") as out:  # a file: a pipe nobody reads fills up and stalls the server
        proc = subprocess.Popen(how.argv, env={**env, **how.env}, cwd=how.cwd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{how.argv[0]} exited ({proc.returncode}): {log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"not answering after {timeout:.0f} s: {log.read_text()[-3000:]}")
            with contextlib.suppress(OSError, RuntimeError, asyncio.IncompleteReadError):
                asyncio.run(fetch_vectors(port, ["ready?"], 0))
                break
            time.sleep(0.5)
        yield proc
    finally:
        machine.stop(proc)


@contextlib.contextmanager
def _log_tail_on_error(log: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        tail = log.read_text(errors="replace")[-3000:]
        print(f"--- the end of the server's log ({log.name}) ---\n{tail}", flush=True)
        raise


def rss_mib(root: int) -> float:
    total = 0.0
    for pid in process_tree(root):
        with contextlib.suppress(OSError, StopIteration):
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            total += int(next(x for x in lines if x.startswith("VmRSS:")).split()[1]) / 1024
    return total


def prepare_infinity(st_dir: Path, out: Path, peers_python: Path) -> None:
    """The ONNX engine's model directory and its optimised graph (benchmarks/peers_prepare.py), built once."""
    subprocess.run([str(peers_python), "-m", "benchmarks.peers_prepare", str(st_dir), str(out),
                    str(out.parent / "hf-home")], cwd=REPO, check=True)


# --- the run -------------------------------------------------------------------------------------
def run_round(name: str, how: Launch, port: int, check: tuple[list[str], np.ndarray], work: list[Phase],
              duration: float, log: Path) -> dict:
    """One round of one server: start, check its vectors, every phase unless they FAIL, its memory, stop."""
    with running(how, port, log) as proc, _log_tail_on_error(log):
        cosine, ok = check_vectors(port, *check)
        row: dict = {"min_cosine": cosine, "ok": ok, "phases": {}}
        print(f"  {name:<22} min cosine to sentence-transformers {cosine:.6f} {'ok' if ok else 'FAIL'}", flush=True)
        if ok:
            for phase in work:
                row["phases"][phase.name] = figures = measure(port, proc.pid, phase, duration)
                print(f"    {phase.name:<14} {figures['sent_s']:8.1f} sent/s  p50 {figures['p50_ms']:7.1f} ms  "
                      f"p99 {figures['p99_ms']:7.1f} ms  server {figures['server_cpu_ms_per_item']:6.2f} CPU ms/item"
                      f"  errors {figures['errors']} (429s retried {figures['retried_429']}) "
                      f"{figures.get('first_error', '')}", flush=True)
            row["rss_mib"] = rss_mib(proc.pid)
    return row


def combine(rounds: dict[str, list[dict]]) -> dict[str, dict]:
    """Per server: the check (its worst round), and each phase's figures as the median of its rounds."""
    out = {}
    for name, rows in rounds.items():
        ok = all(r["ok"] for r in rows)
        entry: dict = {"ok": ok, "min_cosine": min(r["min_cosine"] for r in rows), "rounds": len(rows)}
        if ok and rows:
            entry["phases"] = {p: median_of_rounds([r["phases"][p] for r in rows]) for p in rows[0]["phases"]}
            entry["rss_mib"] = statistics.median(r["rss_mib"] for r in rows)
        out[name] = entry
    return out


def report(results: dict[str, dict], phase_names: list[str]) -> list[tuple[str, bool]]:
    """The side-by-side table, the ratios to Infinity's better engine, and the targets' PASS/FAIL lines."""
    names = list(results)
    print(f"\n{'sentences/s (median of rounds)':<32}" + "".join(f"{n:>24}" for n in names))
    rows = [("sent/s", "sent_s", "{:.1f}"), ("p50 ms", "p50_ms", "{:.1f}"), ("p99 ms", "p99_ms", "{:.1f}"),
            ("server CPU ms/sentence", "server_cpu_ms_per_item", "{:.2f}"),
            ("client CPU us/request", "client_cpu_us_per_request", "{:.0f}"), ("errors", "errors", "{:.0f}"),
            ("429s waited out, sent again", "retried_429", "{:.0f}")]
    for phase in phase_names:
        for label, key, fmt in rows:
            cells = [fmt.format(r["phases"][phase][key]) if r["ok"] else "FAIL" for r in results.values()]
            print(f"{phase + ' ' + label:<32}" + "".join(f"{c:>24}" for c in cells))
    print(f"{'memory (RSS, all processes) MiB':<32}"
          + "".join(f"{r['rss_mib']:>24.0f}" if r["ok"] else f"{'FAIL':>24}" for r in results.values()))
    print(f"{'min cosine to sent.-transformers':<32}" + "".join(f"{r['min_cosine']:>24.6f}" for r in results.values()))

    checks = [(f"{n}: vectors match sentence-transformers' (min cosine {r['min_cosine']:.6f} >= {MIN_COSINE})",
               r["ok"]) for n, r in results.items()]
    checks += [(f"{n}: every request answered 200 ({sum(f['errors'] for f in r['phases'].values()):.0f} not)",
                not any(f["errors"] for f in r["phases"].values())) for n, r in results.items() if r["ok"]]
    ours = results.get("sembed")
    infinity = {n: r for n, r in results.items() if n.startswith("infinity-") and r["ok"]}
    if not (ours and ours["ok"] and infinity):
        return checks
    print("\nsembed / Infinity's better engine in that phase")
    for phase in phase_names:
        best = max(infinity, key=lambda n: infinity[n]["phases"][phase]["sent_s"])
        ratio = _ratio(ours["phases"][phase]["sent_s"], infinity[best]["phases"][phase]["sent_s"])
        others = "  ".join(f"{n} {_ratio(ours['phases'][phase]['sent_s'], r['phases'][phase]['sent_s']):.2f}x"
                           for n, r in results.items() if n != "sembed" and r["ok"])
        print(f"  {phase:<14} {ratio:5.2f}x ({best})   vs each: {others}")
        if phase in TARGETS:
            checks.append((f"{phase}: sentences/s {ratio:.2f}x Infinity's better engine ({best}) >= {TARGETS[phase]}x",
                           ratio >= TARGETS[phase]))
    if "c64" in phase_names:
        theirs = min(r["phases"]["c64"]["p99_ms"] for r in infinity.values())
        mine = ours["phases"]["c64"]["p99_ms"]
        checks.append((f"c64: p99 {mine:.0f} ms <= Infinity's ({theirs:.0f} ms, its better engine's)", mine <= theirs))
    return checks


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path("models/all-MiniLM-L6-v2"), help="our export")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--peers-python", type=Path, default=Path(".venv/peers/bin/python"),
                        help="the environment with infinity-emb (benchmarks/peers-requirements.txt)")
    parser.add_argument("--servers", default=",".join(SERVERS), help="which, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of load per phase")
    parser.add_argument("--batch-concurrency", type=int, default=4, help="connections posting batches")
    parser.add_argument("--work-dir", type=Path, default=Path("models/peers"),
                        help="Infinity's ONNX model directory and cache, built once")
    parser.add_argument("--out", type=Path, default=None, help="also write the run as JSON here")
    args = parser.parse_args(argv)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    for s in servers:
        if s not in SERVERS:
            parser.error(f"unknown server {s!r}; known: {', '.join(SERVERS)}")

    from tokenizers import Tokenizer

    from core.default_model import resolve_model

    cpu = machine.cpu_line()
    print(cpu, flush=True)
    manifest = json.loads((args.model_dir / "manifest.json").read_text())
    st_dir = Path(resolve_model(manifest["base_model"]))
    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    short = corpus_sentences(args.data_dir, 4096)
    _, long = make_texts(tokenizer, args.data_dir, 0, 256)
    lengths = [len(e.ids) for e in tokenizer.encode_batch(short)]
    print(f"texts: {len(short)} corpus sentences of {min(lengths)}-{max(lengths)} tokens (median "
          f"{statistics.median(lengths):.0f}) for singles and short batches, {len(long)} of 124-132 tokens for long "
          f"batches; {args.rounds} rounds of {args.duration:g} s per phase; batches at concurrency "
          f"{args.batch_concurrency}; POST {PATH} on each", flush=True)
    check_texts = short[:12] + long[:4]
    reference = reference_vectors(st_dir, check_texts)
    infinity_dir = args.work_dir / f"{MODEL_NAME}-infinity-onnx"
    if "infinity-onnx" in servers:
        prepare_infinity(st_dir, infinity_dir, args.peers_python)
    work = phases(short, long, args.batch_concurrency)
    rounds: dict[str, list[dict]] = {s: [] for s in servers}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        for r in range(args.rounds):
            order = servers[r % len(servers):] + servers[:r % len(servers)]  # each round starts elsewhere
            print(f"\nround {r + 1}/{args.rounds} (load average {os.getloadavg()[0]:.1f})", flush=True)
            for name in order:
                if rounds[name] and not rounds[name][-1]["ok"]:
                    continue  # failed its check: not measured
                port = free_port()
                how = launch(name, port, model_dir=args.model_dir.resolve(), st_dir=st_dir,
                             infinity_dir=infinity_dir.resolve(), peers_python=args.peers_python.absolute())
                rounds[name].append(run_round(name, how, port, (check_texts, reference), work, args.duration,
                                              Path(tmp) / f"{name}-{r}.log"))
            load.append(os.getloadavg()[0])
    results = combine(rounds)
    checks = report(results, [p.name for p in work])
    print(f"\nload average (1 min) over the run: {min(load):.1f}-{max(load):.1f}")
    # machine.finish adds the date and commit, as for every bench
    record = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "cpu": cpu, "load_average": load, "settings": {k: str(v) for k, v in vars(args).items()},
              "results": results, "rounds": rounds}
    print()
    return machine.finish(checks, record, args.out)


def corpus_sentences(data_dir: Path, n: int) -> list[str]:
    """The unlabelled corpus's first `n` sentences as they are (README of the data folder); without it, the
    serving bench's generated ones."""
    corpus = data_dir / "corpus" / "wordnet-sentences.txt"
    if corpus.is_file():
        with open(corpus, encoding="utf-8") as f:
            return [line.strip() for _, line in zip(range(n), f) if line.strip()]
    rng = random.Random(0)
    vocab = "the a man woman dog plays runs eats reads near under old young river city guitar book music".split()
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(6, 14))) + "." for _ in range(n)]


if __name__ == "__main__":
    sys.exit(main())
