"""The engine's own CPU per request, in process: admission, queue, passes and answers, no model, no IPC.

An `Engine` on the null backend (the export's real dimension, constant vectors) takes prepared token batches
of the bench's short texts (as the API processes send them), `--in-flight` at a time, each answered as the
engine server answers it (`release`, `result`); CPU time of the whole process (the submitting thread and the
engine's threads) per request and per row, for each request size, the sizes alternating over `--rounds`
(median). What `make bench-frontend` counts as the engine process's share, without the HTTP side and the
ZeroMQ hop: the cost of the engine's Python per request and per row.

    python -m benchmarks.engine [--model-dir models/all-MiniLM-L6-v2] [--rows 1,32,256]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections import deque
from pathlib import Path

from benchmarks import machine
from benchmarks.frontend import short_texts
from service.engine.backends.null import NullBackend
from service.engine.core import Engine, EngineConfig
from service.ipc.messages import TokenBatch
from service.process import keep_freed_memory


def cpu_per_request(engine: Engine, batch: TokenBatch, in_flight: int, requests: int) -> float:
    """Seconds of this process's CPU per request, `in_flight` submitted at a time."""
    finished = threading.Semaphore(0)
    jobs: deque = deque()
    start = time.process_time()
    submitted = answered = 0
    while answered < requests:
        while len(jobs) < in_flight and submitted < requests:
            jobs.append(engine.submit(batch, on_done=lambda job: finished.release()))
            submitted += 1
        finished.acquire()  # one more finished: answer every finished job, oldest first
        while jobs and jobs[0].finished:
            job = jobs.popleft()
            engine.release(job)
            engine.result(job)
            answered += 1
    return (time.process_time() - start) / requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path("models/all-MiniLM-L6-v2"))
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--rows", default="1,32,256", help="texts per request")
    parser.add_argument("--in-flight", type=int, default=16, help="requests submitted and not yet answered")
    parser.add_argument("--rows-per-round", type=int, default=40_000, help="rows each size runs per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    from tokenizers import Tokenizer

    print(machine.cpu_line())
    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    texts = short_texts(tokenizer, args.data_dir)
    keep_freed_memory()  # as the engine process does
    engine = Engine(NullBackend(args.model_dir), EngineConfig.from_settings(backend="null"))
    engine.start()
    sizes = [int(n) for n in args.rows.split(",")]
    batches = {n: TokenBatch.from_rows([e.ids for e in tokenizer.encode_batch(
        [texts[i % len(texts)] for i in range(n)])]) for n in sizes}
    figures: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(args.rounds):
        for n in sizes:
            in_flight = max(1, min(args.in_flight, engine.config.max_queued_inputs // n))  # all of them admitted
            figures[n].append(cpu_per_request(engine, batches[n], in_flight, max(1, args.rows_per_round // n)))
    engine.stop()
    print(f"null backend, {args.in_flight} requests in flight (at most the engine's max_queued_inputs rows), "
          f"median of {args.rounds} rounds; short texts (10-14 tokens)\n  rows   µs CPU / request   µs / row")
    for n in sizes:
        seconds = statistics.median(figures[n])
        print(f"{n:6d} {seconds * 1e6:18.1f} {seconds * 1e6 / n:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
