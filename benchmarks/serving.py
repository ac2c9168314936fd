"""`make bench`: the serving engine against sentence-transformers and bare onnxruntime, side by side.

One run on one machine, so the ratios hold even where absolute speeds move between CPUs:
  1. batch 32, short (~12 tokens) and long (~128 tokens) texts: sentence-transformers `encode`,
     onnxruntime in process (the export's graph, default session options), and our service over HTTP;
  2. single-sentence requests at concurrency 1/8/32/64 against the service: throughput and
     p50/p95/p99 latency;
  3. the vector cache (SEMBED_CACHE_MB): batches of 32 texts drawn by Zipf's law so that half of them repeat
     a text sent before, against the same service without the cache; and texts that never repeat (every
     one a miss), for what a miss costs;
and prints PASS/FAIL for the targets of the serving-engine issue. The load generator is a raw
HTTP/1.1 keep-alive client on asyncio, so its own cost on the shared cores stays small.

    python -m benchmarks.serving [--model-dir models/all-MiniLM-L6-v2] [--data-dir ../shared/data]
    python -m benchmarks.serving --cache-only   # the cache's workload alone (3. above)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import machine
from benchmarks.machine import cpu_seconds, process_tree
from service.settings import MEMORY_ONLY

BATCH = 32
#: clients of the cache's workload: requests in flight together, as a service has them
CACHE_CLIENTS = 4
CONCURRENCY = (1, 8, 32, 64)


# --- the machine ---------------------------------------------------------------------------------
def cpu_line() -> str:
    import onnxruntime

    return f"{machine.cpu_line()}; onnxruntime {onnxruntime.__version__}"


# --- the texts -----------------------------------------------------------------------------------
def make_texts(tokenizer, data_dir: Path, n_short: int, n_long: int) -> tuple[list[str], list[str]]:
    """Short: real sentences of 10–14 tokens; long: sentences joined to 124–132 tokens."""
    corpus = data_dir / "corpus" / "wordnet-sentences.txt"
    if corpus.is_file():
        sentences = corpus.read_text().splitlines()[:20000]
    else:  # the bench must run without the data folder: plain generated sentences
        rng = random.Random(0)
        vocab = ("the a man woman dog cat plays runs eats reads near under over quickly slowly old young "
                 "river city guitar book green small large music morning night street house").split()
        sentences = [" ".join(rng.choice(vocab) for _ in range(rng.randint(6, 14))) + "." for _ in range(20000)]
    lengths = [len(e.ids) for e in tokenizer.encode_batch(sentences)]
    short = [s for s, n in zip(sentences, lengths) if 10 <= n <= 14][:n_short]
    long, current, size = [], [], 2
    for s, n in zip(sentences, lengths):
        current.append(s)
        size += n - 2
        if size >= 124:
            if size <= 132:
                long.append(" ".join(current))
            current, size = [], 2
        if len(long) == n_long:
            break
    return short, long


def cache_pool(data_dir: Path, tokenizer) -> list[str]:
    """Distinct real sentences of 10–14 tokens, as the short texts (or generated ones without the data folder), in a
    fixed order: texts of one length, so that half the texts repeating is half the tokens repeating too, whichever
    texts the Zipf draws make the frequent ones."""
    corpus = data_dir / "corpus" / "wordnet-sentences.txt"
    if corpus.is_file():
        lines = corpus.read_text().splitlines()
    else:
        rng = random.Random(1)
        vocab = ("the a man woman dog cat plays runs eats reads near under over quickly slowly old young "
                 "river city guitar book green small large music morning night street house").split()
        lines = [" ".join(rng.choice(vocab) for _ in range(rng.randint(8, 12))) + "." for _ in range(60000)]
    lines = list(dict.fromkeys(line.strip() for line in lines if line.strip()))
    return [text for text, e in zip(lines, tokenizer.encode_batch(lines)) if 10 <= len(e.ids) <= 14]


def zipf_ranks(n: int, repeats: float = 0.5, seed: int = 0) -> list[int]:
    """n draws of Zipf's law (rank k weighs 1/k) over as many ranks as make `repeats` of the draws a rank
    drawn before, numbered by first appearance (0, 1, 2, ...)."""
    def draw(m: int) -> list[int]:
        weights = 1.0 / np.arange(1, m + 1)
        return np.random.default_rng(seed).choice(m, size=n, p=weights / weights.sum()).tolist()

    low, high = 1, 1_000_000  # more ranks: fewer repeats
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if 1 - len(set(draw(mid))) / n > repeats else (low, mid)
    order: dict[int, int] = {}
    return [order.setdefault(rank, len(order)) for rank in draw(high)]


# --- in process ------------------------------------------------------------------------------------
def rate(fn, texts: list[str], repeats: int = 3) -> float:
    """Sentences per second, best of `repeats` passes over `texts` in batches of BATCH."""
    batches = [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)]
    fn(batches[0])  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for b in batches:
            fn(b)
        best = min(best, time.perf_counter() - start)
    return len(texts) / best


def sentence_transformers_encoder(model_dir: Path):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(os.cpu_count() or 1)
    model = SentenceTransformer(str(model_dir), device="cpu")
    return lambda batch: model.encode(batch, batch_size=BATCH, normalize_embeddings=True)


def onnxruntime_encoder(export_dir: Path, graph: str = "model.onnx"):
    """What a user writes with onnxruntime and tokenizers: default session, pad to the batch's longest."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    manifest = json.loads((export_dir / "manifest.json").read_text())
    tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
    tokenizer.enable_truncation(manifest["max_seq_length"])
    tokenizer.enable_padding(pad_id=manifest["pad_token_id"], pad_token=manifest["pad_token"])
    session = ort.InferenceSession(str(export_dir / graph), providers=["CPUExecutionProvider"])
    names = manifest["inputs"]

    def encode(batch):
        enc = tokenizer.encode_batch(batch)
        feeds = {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                 "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64)}
        if "token_type_ids" in names:
            feeds["token_type_ids"] = np.array([e.type_ids for e in enc], dtype=np.int64)
        return session.run(["embedding"], feeds)[0]

    return encode


# --- over HTTP -------------------------------------------------------------------------------------
class Connection:
    """One keep-alive HTTP/1.1 connection: the least client code between the load and the server (ours or a peer's,
    whose answers may come chunked)."""

    def __init__(self, port: int):
        self.port = port
        self.retry_after: float | None = None  # the last answer's Retry-After, seconds

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        status, length, chunked = int(head[9:12]), 0, False
        self.retry_after = None
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
            elif name.lower() == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name.lower() == b"retry-after":
                self.retry_after = float(value)
        if not chunked:
            return status, await self.reader.readexactly(length)
        parts = []
        while size := int((await self.reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16):
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)
        await self.reader.readuntil(b"\r\n")  # the empty trailer
        return status, b"".join(parts)

    def close(self) -> None:
        self.writer.close()


def start_service(export_dir: Path, variant: str = "fp32", cache_mb: float = 0) -> tuple[subprocess.Popen, int]:
    """`python -m service` on a free port. The vector cache is off unless `cache_mb` is given: the rounds send the
    same texts again, and everything but the cache's own workload measures the engine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SEMBED_MODEL_DIR": str(export_dir), "SEMBED_PORT": str(port), "SEMBED_HOST": "127.0.0.1",
           "SEMBED_VARIANT": variant, "SEMBED_INDEX_PATH": MEMORY_ONLY,  # the bench never keeps an index
           "SEMBED_CACHE_MB": str(cache_mb)}
    # The log goes to a file: a pipe nobody reads fills up with access lines and stalls the service.
    log_file = tempfile.NamedTemporaryFile(prefix="sembed-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "service"], env=env, stdout=log_file, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return proc, port
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited: {Path(log_file.name).read_text()[-2000:]}")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the service did not become ready in 120 s")


async def http_batches(port: int, texts: list[str], repeats: int = 3) -> tuple[float, float]:
    """(sentences/s, mean seconds per batch request), one request at a time, best of `repeats`."""
    conn = await Connection(port).open()
    bodies = [json.dumps({"inputs": texts[i : i + BATCH]}).encode() for i in range(0, len(texts), BATCH)]
    await conn.post("/embed", bodies[0])
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for body in bodies:
            status, _ = await conn.post("/embed", body)
            assert status == 200, status
        best = min(best, time.perf_counter() - start)
    conn.close()
    return len(texts) / best, best / len(bodies)


async def http_singles(port: int, texts: list[str], concurrency: int, total: int) -> dict:
    conns = [await Connection(port).open() for _ in range(concurrency)]
    bodies = [json.dumps({"inputs": [t]}).encode() for t in texts]
    latencies: list[float] = []
    errors = 0
    counter = iter(range(total))

    async def worker(conn: Connection) -> None:
        nonlocal errors
        for i in counter:
            start = time.perf_counter()
            status, _ = await conn.post("/embed", bodies[i % len(bodies)])
            latencies.append(time.perf_counter() - start)
            errors += status != 200

    await asyncio.gather(*(worker(c) for c in conns[:concurrency]))  # warm-up round
    counter = iter(range(total))
    latencies.clear()
    start = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - start
    for c in conns:
        c.close()
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"rps": total / elapsed, "p50": q[49], "p95": q[94], "p99": q[98], "errors": errors}


async def http_stream(port: int, texts: list[str], concurrency: int = CACHE_CLIENTS) -> float:
    """Sentences per second of `texts` sent in order as requests of BATCH by `concurrency` clients, each sending
    the next request of the stream once its last is answered."""
    conns = [await Connection(port).open() for _ in range(concurrency)]
    bodies = iter([json.dumps({"inputs": texts[i : i + BATCH]}).encode() for i in range(0, len(texts), BATCH)])

    async def client(conn: Connection) -> None:
        for body in bodies:
            status, answer = await conn.post("/embed", body)
            assert status == 200, (status, answer[:300])

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    elapsed = time.perf_counter() - start
    for c in conns:
        c.close()
    return len(texts) / elapsed


def cache_bench(services: dict[str, tuple[subprocess.Popen, int]], pool: list[str], n: int, rounds: int,
                clients: int = CACHE_CLIENTS) -> dict:
    """The vector cache's workload: each round a Zipf stream of n texts (half of them a text sent before) and n
    texts that never repeat, both new to every service, sent to the service with the cache ("cache") and the one
    without ("no cache"), which goes first alternating. Per workload and service: texts per second (the best round,
    and each round's cache / no cache back to back) and the server's CPU seconds per text (all its processes, all
    rounds); the load average."""

    ranks = zipf_ranks(n)
    distinct = max(ranks) + 1
    if len(pool) < rounds * (distinct + n) + 1:
        raise SystemExit(f"the cache bench needs {rounds * (distinct + n)} distinct texts; the pool has {len(pool)}")
    best: dict[str, dict[str, float]] = {"repeated": {}, "unique": {}, "all hits": {}}
    paired: dict[str, list[float]] = {"repeated": [], "unique": []}  # each round's cache / no cache, back to back
    cpu: dict[str, dict[str, float]] = {"repeated": {}, "unique": {}, "all hits": {}}  # seconds, all rounds
    load = [os.getloadavg()[0]]
    hits: dict[str, list[float]] = {}  # workload → the cache's [hits, misses], all rounds

    def run(who: str, workload: str, texts: list[str]) -> float:
        proc, port = services[who]
        pids = process_tree(proc.pid)
        before, counted = sum(cpu_seconds(pids).values()), cache_counts(port)
        rate = asyncio.run(http_stream(port, texts, clients))
        cpu[workload][who] = cpu[workload].get(who, 0.0) + sum(cpu_seconds(pids).values()) - before
        hits[workload] = [a + b - c for a, b, c in zip(hits.get(workload, [0, 0]), cache_counts(port), counted)]
        best[workload][who] = max(best[workload].get(who, 0.0), rate)
        return rate

    for r in range(rounds):
        fresh = pool[r * (distinct + n):(r + 1) * (distinct + n)]
        streams = {"repeated": [fresh[k] for k in ranks], "unique": fresh[distinct:]}
        order = ["no cache", "cache"] if r % 2 == 0 else ["cache", "no cache"]
        for workload, texts in streams.items():
            rates = {who: run(who, workload, texts) for who in order}
            paired[workload].append(rates["cache"] / rates["no cache"])
        run("cache", "all hits", streams["repeated"])  # the same stream again: every text a hit
        load.append(os.getloadavg()[0])
    per_text = {w: {who: seconds / (n * rounds) for who, seconds in c.items()} for w, c in cpu.items()}
    # On a host this loaded a round's throughput moves by more than the 5% a miss may cost: the server's CPU per
    # text (what a saturated host's throughput is the inverse of) judges, the throughput ratios are shown beside it.
    return {"texts": n, "repeats": 1 - distinct / n, "rounds": rounds, "batch": BATCH, "clients": clients,
            "rate": best, "paired": paired, "cpu_per_text": per_text,
            "hit_rate": {w: h / max(1.0, h + m) for w, (h, m) in hits.items()},
            "speedup": per_text["repeated"]["no cache"] / per_text["repeated"]["cache"],
            "miss_cost": per_text["unique"]["cache"] / per_text["unique"]["no cache"] - 1,
            "load_average": {"min": min(load), "max": max(load), "samples": load}}


def cache_counts(port: int) -> tuple[float, float]:
    """The service's sembed_cache_hits_total and sembed_cache_misses_total, summed over its models."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        lines = r.read().decode().splitlines()
    return tuple(sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{"))
                 for name in ("sembed_cache_hits_total", "sembed_cache_misses_total"))  # type: ignore[return-value]


def report_cache(c: dict) -> None:
    load = c["load_average"]
    print(f"\nvector cache: {c['clients']} clients sending batches of {c['batch']}, {c['texts']} texts a round "
          f"({c['repeats']:.0%} repeats, Zipf), {c['rounds']} alternating rounds; load average "
          f"{load['min']:.2f}–{load['max']:.2f} on {os.cpu_count()} cores")
    print(f"{'':<26}{'server CPU per text':^36}{'texts/s, best round':^30}{'texts/s ratio by round':>24}")
    print(f"{'workload':<26}{'no cache':>12}{'cache':>12}{'ratio':>12}{'no cache':>10}{'cache':>10}{'ratio':>10}"
          f"{'median':>10}{'range':>14}")
    for workload, label in (("repeated", "Zipf, half repeats"), ("unique", "no repeats (all misses)"),
                            ("all hits", "the Zipf texts again")):
        cpu, rate = c["cpu_per_text"][workload], c["rate"][workload]
        line = f"{label:<26}"
        if workload == "all hits":  # the cache's ceiling: every text a hit
            line += f"{'':>12}{cpu['cache'] * 1e6:>9.0f} µs{'':>12}{'':>10}{rate['cache']:>10.0f}"
        else:
            rounds = c["paired"][workload]
            line += (f"{cpu['no cache'] * 1e6:>9.0f} µs{cpu['cache'] * 1e6:>9.0f} µs"
                     f"{cpu['no cache'] / cpu['cache']:>11.3f}x{rate['no cache']:>10.1f}{rate['cache']:>10.1f}"
                     f"{rate['cache'] / rate['no cache']:>9.3f}x{statistics.median(rounds):>9.3f}x"
                     f"{min(rounds):>7.2f}–{max(rounds):.2f}")
        print(line)
    print(f"texts the cache answered: {c['hit_rate'].get('repeated', 0):.1%} of the Zipf stream (requests in flight "
          f"together cannot hit on each other's texts), {c['hit_rate'].get('all hits', 0):.1%} of it sent again")
    print(f"the cache on repeated texts: {c['speedup']:.2f}x the throughput of CPU without it; a miss costs "
          f"{c['miss_cost']:+.1%} of CPU over no cache")


def cache_checks(c: dict) -> list[tuple[str, bool]]:
    return [(f"cache: repeated texts (Zipf, half repeats) ≥ 1.8× the throughput without it, by server CPU per text "
             f"({c['speedup']:.2f}×)", c["speedup"] >= 1.8),
            (f"cache: a miss costs ≤ 5% over no cache, by server CPU per text ({c['miss_cost']:+.1%})",
             c["miss_cost"] <= 0.05)]


def rss_mb(root: int) -> tuple[float, float]:
    """(current, peak) resident memory of the service, MB: summed over its processes (the supervisor, the
    API processes, the engines, the index), each one's peak counted at its own high-water mark (Linux)."""
    now = peak = 0.0
    for pid in process_tree(root):
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        now += int(fields["VmRSS"].split()[0]) / 1024
        peak += int(fields["VmHWM"].split()[0]) / 1024
    return now, peak


async def at_the_limits(port: int, long_texts: list[str]) -> dict:
    """One request of 256 texts over the model's length, and a one-text request sent while it runs."""
    big = json.dumps({"inputs": [(t + " ") * 3 for t in (long_texts * 4)[:256]]}).encode()
    small = json.dumps({"inputs": ["Is anybody there?"]}).encode()
    big_conn, small_conn = await Connection(port).open(), await Connection(port).open()
    start = time.perf_counter()
    big_task = asyncio.ensure_future(big_conn.post("/embed", big))
    await asyncio.sleep(0.5)
    small_start = time.perf_counter()
    small_status, _ = await small_conn.post("/embed", small)
    small_s = time.perf_counter() - small_start
    big_status, _ = await big_task
    big_conn.close()
    small_conn.close()
    return {"big_s": time.perf_counter() - start, "small_s": small_s, "status": (big_status, small_status),
            "body_bytes": len(big)}


# --- the run -----------------------------------------------------------------------------------------
def sts_drop(model_dir: Path, data_dir: Path, variants: dict[str, str]) -> dict[str, dict[str, float]]:
    """The 7 STS tasks per variant (label: the manifest's variant), in process through the service's backend."""
    from evaluation.embedders import OnnxEmbedder
    from evaluation.sts import evaluate_sts

    return {label: evaluate_sts(OnnxEmbedder(model_dir, variant=v), data_dir=data_dir) for label, v in variants.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path("models/all-MiniLM-L6-v2"), help="an export")
    parser.add_argument("--st-model", type=Path, default=None,
                        help="sentence-transformers directory of the same model (default: the export's base model, "
                        "the embedded all-MiniLM-L6-v2 or all-mpnet-base-v2)")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--short", type=int, default=640, help="short texts per pass")
    parser.add_argument("--long", type=int, default=128, help="long texts per pass")
    parser.add_argument("--requests", type=int, default=640, help="single-sentence requests per concurrency")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating rounds of the side-by-side comparisons (each keeps its best)")
    parser.add_argument("--no-sts", action="store_true", help="skip the 7-task STS of each variant")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here as JSON")
    parser.add_argument("--cache-texts", type=int, default=2048,
                        help="texts per round of the cache's workload (the requests in flight together are a smaller "
                        "share of more texts: they cannot hit on each other's texts)")
    parser.add_argument("--cache-mb", type=float, default=64, help="SEMBED_CACHE_MB of the service with the cache")
    parser.add_argument("--cache-only", action="store_true", help="run the cache's workload alone")
    parser.add_argument("--cache-clients", type=int, default=CACHE_CLIENTS, help="clients of the cache's workload")
    args = parser.parse_args(argv)
    if args.cache_only:
        return cache_only(args)

    from tokenizers import Tokenizer

    print(cpu_line(), flush=True)
    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    short, long = make_texts(tokenizer, args.data_dir, args.short, args.long)
    print(f"texts: {len(short)} short, {len(long)} long; batch {BATCH}; {args.rounds} rounds\n", flush=True)

    manifest = json.loads((args.model_dir / "manifest.json").read_text())
    st_dir = args.st_model
    if st_dir is None:  # the export's own base model where it is one of ours (the embedded default, all-mpnet-base-v2)
        from core.default_model import resolve_model

        st_dir = resolve_model(manifest["base_model"])
    results: dict = {"cpu": cpu_line(), "batch": {}, "singles": {}}
    # the int8 graph SEMBED_VARIANT=int8 serves, in process too
    int8_entry = (manifest.get("variants") or {}).get("int8")
    # Every contender, in process or over HTTP; a service is idle while the others run (its threads do not spin).
    contenders = {"sentence-transformers": sentence_transformers_encoder(st_dir),
                  "onnxruntime": onnxruntime_encoder(args.model_dir)}
    services = {"service": start_service(args.model_dir)}
    cached = start_service(args.model_dir, cache_mb=args.cache_mb)  # the cache's workload only
    if int8_entry:
        contenders["onnxruntime int8"] = onnxruntime_encoder(args.model_dir, int8_entry["file"])
        services["service int8"] = start_service(args.model_dir, variant="int8")
    port = services["service"][1]
    try:
        # Rounds alternate every contender, and each keeps its best: a shared host's speed drifts within minutes
        # (RESULTS.md, "Serving on a CPU"), and a ratio of two figures taken minutes apart would measure the drift.
        best: dict = {name: {"service_request_s": {}} for name in ("short", "long")}
        c64: dict | None = None
        for _ in range(args.rounds):
            for name, texts in (("short", short), ("long", long)):
                row = best[name]
                for who, fn in contenders.items():
                    row[who] = max(row.get(who, 0.0), rate(fn, texts, 1))
                for who, (_, service_port) in services.items():
                    rps, latency = asyncio.run(http_batches(service_port, texts, 1))
                    if rps > row.get(who, 0.0):
                        row[who], row["service_request_s"][who] = rps, latency
            # concurrency 64 against the batch-32 figure of this same round set
            r = asyncio.run(http_singles(port, short, 64, max(args.requests, 4 * 64)))
            if c64 is None or r["rps"] > c64["rps"]:
                c64 = r
        if int8_entry:
            for name, texts in (("short", short), ("long", long)):
                a, b = contenders["onnxruntime"](texts[:256]), contenders["onnxruntime int8"](texts[:256])
                best[name]["int8_mean_cosine"] = float((a * b).sum(axis=1).mean())
        results["batch"] = best
        results["cache"] = cache_bench({"no cache": services["service"], "cache": cached},
                                       cache_pool(args.data_dir, tokenizer), args.cache_texts, args.rounds,
                                       args.cache_clients)
        contenders.clear()
        for c in CONCURRENCY[:-1]:
            results["singles"][c] = asyncio.run(http_singles(port, short, c, max(args.requests, 4 * c)))
        results["singles"][64] = c64
        proc = services["service"][0]
        before = rss_mb(proc.pid)[0]
        results["limits"] = asyncio.run(at_the_limits(port, long))
        time.sleep(0.5)
        after, peak = rss_mb(proc.pid)
        results["limits"].update({"rss_before_mb": before, "rss_peak_mb": peak, "rss_after_mb": after})
    finally:
        stop({**services, "service cached": cached})
    variants = ["fp32"] + (["int8"] if int8_entry else [])
    if not args.no_sts and (args.data_dir / "senteval").is_dir():
        print("7-task STS per variant (in process) ...", flush=True)
        results["sts"] = sts_drop(args.model_dir, args.data_dir,
                                  {"fp32": "fp32", **({"int8": "int8"} if int8_entry else {})})

    report(results, variants)
    report_cache(results["cache"])
    checks = targets(results, int8_entry is not None) + cache_checks(results["cache"])
    print()
    if not int8_entry:
        print("n/a   int8 targets: this export has no int8 variant")
    elif "sts" not in results:
        print("n/a   int8 7-task STS drop: not measured (--no-sts, or no senteval data)")
    return machine.finish(checks, results, args.out)


def stop(services: dict[str, tuple[subprocess.Popen, int]]) -> None:
    for proc, _ in services.values():
        proc.terminate()
        proc.wait(timeout=30)


def cache_only(args) -> int:
    """`--cache-only`: the cache's workload against two fresh services, one with the cache and one without."""
    from tokenizers import Tokenizer

    print(cpu_line(), flush=True)
    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    pool = cache_pool(args.data_dir, tokenizer)
    services = {"no cache": start_service(args.model_dir),
                "cache": start_service(args.model_dir, cache_mb=args.cache_mb)}
    try:
        results = {"cpu": cpu_line(),
                   "cache": cache_bench(services, pool, args.cache_texts, args.rounds, args.cache_clients)}
    finally:
        stop(services)
    report_cache(results["cache"])
    print()
    return machine.finish(cache_checks(results["cache"]), results, args.out)


def report(results: dict, variants: list[str]) -> None:
    int8 = "int8" in variants
    head = f"{'batch of 32':<12}{'sentence-transformers':>22}{'onnxruntime':>13}{'service':>10}{'service/ort':>12}"
    if int8:
        head += f"{'ort int8':>10}{'service int8':>14}{'service/ort':>12}"
    print(head + f"{'service req':>13}")
    for name, r in results["batch"].items():
        line = (f"{name + ' texts':<12}{r['sentence-transformers']:>18.1f} s/s{r['onnxruntime']:>9.1f} s/s"
                f"{r['service']:>6.1f} s/s{r['service'] / r['onnxruntime']:>11.3f}x")
        if int8:
            line += (f"{r['onnxruntime int8']:>6.1f} s/s{r['service int8']:>10.1f} s/s"
                     f"{r['service int8'] / r['onnxruntime int8']:>11.3f}x")
        print(line + f"{r['service_request_s']['service'] * 1000:>10.1f} ms")
    if int8:
        for name, r in results["batch"].items():
            print(f"{name + ' texts':<12}int8 in process = {r['onnxruntime int8'] / r['onnxruntime']:.2f}x fp32, "
                  f"mean cosine to fp32 {r['int8_mean_cosine']:.4f}")
    print(f"\n{'single-sentence requests':<26}{'req/s':>8}{'p50':>10}{'p95':>10}{'p99':>10}{'errors':>8}")
    for c, r in sorted(results["singles"].items()):
        print(f"concurrency {c:<14}{r['rps']:>8.1f}{r['p50'] * 1000:>8.1f}ms{r['p95'] * 1000:>8.1f}ms"
              f"{r['p99'] * 1000:>8.1f}ms{r['errors']:>8}")
    lim = results["limits"]
    print(f"\none request of 256 texts cut to the model's length ({lim['body_bytes'] / 1e6:.1f} MB): "
          f"{lim['big_s']:.1f} s; a one-text request sent 0.5 s into it: {lim['small_s'] * 1000:.0f} ms "
          f"(statuses {lim['status'][0]}, {lim['status'][1]}); service memory (all its processes) "
          f"{lim['rss_before_mb']:.0f} MB before, {lim['rss_peak_mb']:.0f} MB peak, {lim['rss_after_mb']:.0f} MB after")
    if "sts" in results:
        tasks = [t for t in results["sts"]["fp32"] if t != "avg"] + ["avg"]
        print(f"\n{'7-task STS':<10}" + "".join(f"{t.replace('Relatedness', '-R').replace('Benchmark', '-B'):>9}"
                                          for t in tasks))
        for v, scores in results["sts"].items():
            print(f"{v:<10}" + "".join(f"{scores[t]:>9.2f}" for t in tasks))


def targets(results: dict, int8: bool) -> list[tuple[str, bool]]:
    batch, singles = results["batch"], results["singles"]
    c64, short = singles[64], batch["short"]
    checks = []
    for who, ort_ in (("service", "onnxruntime"), ("service int8", "onnxruntime int8"))[: 2 if int8 else 1]:
        for name in ("short", "long"):
            ratio = batch[name][who] / batch[name][ort_]
            checks.append((f"{who} ≥ 0.95× in-process {ort_}, {name} ({ratio:.3f}×)", ratio >= 0.95))
    checks += [
        (f"concurrency-64 singles ≥ 0.8× batch-32 throughput ({c64['rps'] / short['service']:.2f}×)",
         c64["rps"] >= 0.8 * short["service"]),
        (f"concurrency-64 p99 < 10× the batch-32 request latency "
         f"({c64['p99'] / short['service_request_s']['service']:.1f}×)",
         c64["p99"] < 10 * short["service_request_s"]["service"]),
        (f"no errors under load ({sum(r['errors'] for r in singles.values())})",
         all(r["errors"] == 0 for r in singles.values())),
    ]
    if int8:
        vnni = any(f in results["cpu"] for f in ("avx512_vnni", "avx_vnni"))
        need = 1.8 if vnni else 1.3
        for name, r in batch.items():
            ratio = r["onnxruntime int8"] / r["onnxruntime"]
            checks.append((f"int8 ≥ {need}× fp32 ({'VNNI' if vnni else 'AVX2 only'}), {name} ({ratio:.2f}×)",
                           ratio >= need))
            checks.append((f"int8 mean cosine to fp32 ≥ 0.99, {name} ({r['int8_mean_cosine']:.4f})",
                           r["int8_mean_cosine"] >= 0.99))
        if "sts" in results:
            drop = results["sts"]["fp32"]["avg"] - results["sts"]["int8"]["avg"]
            checks.append((f"int8 7-task STS drop ≤ 0.3 ({drop:+.2f})", drop <= 0.3))
    return checks


if __name__ == "__main__":
    sys.exit(main())
