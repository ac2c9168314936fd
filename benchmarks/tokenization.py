"""What tokenisation costs an API process: the tokenizers library against the ASCII WordPiece fast path.

Both through service.tokenization.Tokenizer.encode (TokenBatch out, counts before truncation), on the
bench's short texts (STS-B sentences of 10-14 tokens), one thread, CPU time per sentence, the two
alternating over several rounds (median).

    python -m benchmarks.tokenization [--model-dir models/all-MiniLM-L6-v2] [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from benchmarks.frontend import short_texts
from benchmarks.machine import cpu_line


def cpu_us_per_sentence(encode, batches: list[list[str]], seconds: float) -> float:
    encode(batches[0])
    sentences, start, i = 0, time.process_time(), 0
    while time.process_time() - start < seconds:
        batch = batches[i % len(batches)]
        encode(batch)
        sentences += len(batch)
        i += 1
    return 1e6 * (time.process_time() - start) / sentences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path("models/all-MiniLM-L6-v2"), help="an export")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="per contender and batch size in a round")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as in the API processes

    from tokenizers import Tokenizer as HfTokenizer

    from service.tokenization import Tokenizer

    fast, reference = Tokenizer(args.model_dir), Tokenizer(args.model_dir)
    if fast.wordpiece is None:
        print(f"{args.model_dir}: not BERT's WordPiece pipeline, no fast path to compare")
        return 1
    reference.wordpiece = None
    counter = HfTokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    counter.no_padding()  # an export's tokenizer.json may pad every text to max_seq_length
    texts = short_texts(counter, args.data_dir)
    print(cpu_line())
    print(f"{len(texts)} short texts; {args.rounds} rounds of {args.seconds:g} s each; µs of CPU per sentence, median")
    print(f"{'batch':>6} {'tokenizers':>11} {'fast path':>10} {'ratio':>7}")
    for size in (1, 32, 256):
        batches = [texts[i:i + size] for i in range(0, len(texts) - size + 1, size)]
        runs: dict[str, list[float]] = {"tokenizers": [], "fast path": []}
        for _ in range(args.rounds):
            runs["tokenizers"].append(cpu_us_per_sentence(reference.encode, batches, args.seconds))
            runs["fast path"].append(cpu_us_per_sentence(fast.encode, batches, args.seconds))
        slow, quick = (statistics.median(runs[k]) for k in ("tokenizers", "fast path"))
        print(f"{size:>6} {slow:>11.2f} {quick:>10.2f} {slow / quick:>6.1f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
