"""The seven-task STS report of a served or exported model, over REST or in process (scored by core.sts).

    python -m evaluation.sts --url http://localhost:8080 --data-dir data/datasets [--out results/sts.json]
    python -m evaluation.sts --model models/all-MiniLM-L6-v2 --data-dir data/datasets [--variant int8]

Tasks: STS12–16 in the "all" setting (every subset of a year concatenated, one Spearman), STS-B test,
SICK-R test; "avg" is their mean. Sentences are whitespace-normalised (core.sts). The scoring is
core.sts's, which the training loop's model selection runs on STS-B dev.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from core.data import DataNotFound
from core.sts import Encode, score_task
from evaluation.embedders import Embedder, load_embedder
from evaluation.sts_data import TASKS, load_task


def evaluate_sts(
    embedder: Embedder | Encode, *, data_dir: str | Path, tasks: tuple[str, ...] | list[str] = TASKS
) -> dict[str, float]:
    """{task: Spearman × 100} for each task, plus "avg" (their plain mean, as the papers' Avg.)."""
    results = {name: score_task(load_task(name, data_dir), embedder) for name in tasks}
    results["avg"] = float(np.mean([results[t] for t in tasks]))
    return results


def format_table(model: str, results: dict[str, float]) -> str:
    names = [k for k in results if k != "avg"] + ["avg"]
    head = "| model | " + " | ".join(n.replace("Relatedness", "-R").replace("Benchmark", "-B") for n in names) + " |"
    sep = "|---" * (len(names) + 1) + "|"
    row = f"| {model} | " + " | ".join(f"{results[n]:.2f}" for n in names) + " |"
    return "\n".join([head, sep, row])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--url", help="base URL of a running service")
    source.add_argument("--model", help="export directory or HF/sentence-transformers directory")
    parser.add_argument("--data-dir", type=Path, required=True, help="folder holding senteval/STS, senteval/SICK")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--out", type=Path, help="write the scores as JSON here")
    parser.add_argument("--variant", default="fp32", help="with --model <export>: which graph (fp32, int8, fp16)")
    parser.add_argument("--label", help="row name in reports (default: the model name, '+(service)' with --url)")
    args = parser.parse_args(argv)
    try:  # the data first: a missing set is said before a model loads
        for name in args.tasks:
            load_task(name, args.data_dir)
    except DataNotFound as e:
        raise SystemExit(f"error: {e}") from None

    embedder = load_embedder(args.url, args.model, args.variant)
    label = args.label or (f"{embedder.name} (service)" if args.url else embedder.name)
    start = time.perf_counter()
    results = evaluate_sts(embedder, data_dir=args.data_dir, tasks=args.tasks)
    seconds = time.perf_counter() - start
    print(format_table(label, results))
    print(f"({seconds:.0f} s)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"model": embedder.name, "label": label, "source": args.url or str(args.model),
                  "metric": "Spearman x 100 of cosine similarity", "sts": results, "seconds": round(seconds, 1)}
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
