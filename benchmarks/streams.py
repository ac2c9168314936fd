"""How an engine on a CPU should spend its cores: one pass at a time on every thread, or streams of passes at once.

onnxruntime in process on the export's graph, through the engine's backend (`OnnxBackend`, its two sessions):
for each text length and pass size (tokens a pass, padding none), texts/s of passes run one at a time on all
`--threads`, against `--streams` passes at once, each on its share of the threads (what SEMBED_STREAMS does);
the configurations alternate over `--rounds` (median). Both give the same bits (the backend checks it at load);
what this shows is which is faster on this CPU, and at which pass size (SEMBED_MAX_BATCH_TOKENS / streams).

    python -m benchmarks.streams [--model-dir models/all-MiniLM-L6-v2] [--lengths 16,128] [--tokens 512,2048]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks import machine
from service.engine.backends.onnx import OnnxBackend
from service.hardware import physical_cores
from service.ipc.messages import TokenBatch


def texts_per_s(backend: OnnxBackend, batch: TokenBatch, seq_len: int, streams: int, seconds: float) -> float:
    """Passes of `batch` for about `seconds`: one at a time on every thread (streams 1), else `streams` at once."""
    done = [0] * streams
    end = time.perf_counter() + seconds

    def loop(k: int) -> None:
        while time.perf_counter() < end:
            backend.run(batch, seq_len, wide=streams == 1)
            done[k] += len(batch)

    start = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(k,)) for k in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path("models/all-MiniLM-L6-v2"))
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime threads in all (0: one per core)")
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--lengths", default="16,32,64,128", help="tokens a text")
    parser.add_argument("--tokens", default="256,512,1024,2048", help="tokens a pass (rows: this over the length)")
    parser.add_argument("--seconds", type=float, default=2.0, help="each measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    threads = args.threads or physical_cores()
    print(machine.cpu_line())
    backend = OnnxBackend(args.model_dir, intra_op_threads=threads, streams=args.streams, pad_to_multiple_of=1)
    if backend.streams != args.streams:
        print(f"the backend runs {backend.streams} stream(s): its sessions gave other bits (see its warning)")
        return 1
    vocab = backend.info.vocab_size or 1000
    rng = np.random.default_rng(0)
    rows_out = []
    print(f"{threads} threads: one pass at a time on all of them, against {args.streams} passes at once on "
          f"{threads // args.streams} each; texts/s, median of {args.rounds} rounds")
    print(f"{'length':>6} {'tokens/pass':>11} {'rows':>5} {'one pass':>9} {'streams':>9} {'ratio':>7}")
    for length in (int(x) for x in args.lengths.split(",")):
        for tokens in (int(x) for x in args.tokens.split(",")):
            rows = max(1, tokens // length)
            ids = rng.integers(1000, max(1001, vocab - 1), rows * length).astype(np.int32)
            batch = TokenBatch(ids, np.arange(0, rows * length + 1, length, dtype=np.int64))
            for wide in (True, False):
                backend.run(batch, length, wide)  # warm: the sessions' first run at this shape
            figures: dict[int, list[float]] = {1: [], args.streams: []}
            for round_ in range(args.rounds):
                order = [1, args.streams] if round_ % 2 == 0 else [args.streams, 1]
                for streams in order:
                    figures[streams].append(texts_per_s(backend, batch, length, streams, args.seconds))
            one, many = statistics.median(figures[1]), statistics.median(figures[args.streams])
            print(f"{length:>6} {rows * length:>11} {rows:>5} {one:>9.1f} {many:>9.1f} {many / one:>6.2f}x", flush=True)
            rows_out.append({"length": length, "tokens": rows * length, "rows": rows, "one_pass": one,
                             "streams": many, "rounds": figures})
    return machine.finish([], {"cpu": machine.cpu_line(), "threads": threads, "streams": args.streams,
                               "rows": rows_out}, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
