"""STS evaluation: Spearman × 100 of cosine similarity against gold, on the papers' seven tasks.

    python -m evaluation.sts --url http://localhost:8080 --data-dir ../shared/data [--out results/sts.json]
    python -m evaluation.sts --model models/all-MiniLM-L6-v2 --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from evaluation.embedders import load_embedder
from evaluation.sts_data import TASKS, StsTask, load_task

Encode = Callable[[list[str]], np.ndarray]


def cosine_scores(encode: Encode, task: StsTask) -> np.ndarray:
    """Cosine of each pair; every distinct sentence is embedded once."""
    unique = list(dict.fromkeys(task.sentences1 + task.sentences2))
    vectors = encode(unique)
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-12)
    row = {s: i for i, s in enumerate(unique)}
    a = vectors[[row[s] for s in task.sentences1]]
    b = vectors[[row[s] for s in task.sentences2]]
    return (a * b).sum(axis=1)


def score_task(task: StsTask, encode: Encode) -> float:
    return float(100 * spearmanr(cosine_scores(encode, task), task.scores).statistic)


def stsb_dev_spearman(encode: Encode, data_dir: str | Path | None) -> float:
    """STS-B dev Spearman × 100: the papers' model-selection metric, used by the training loop."""
    if data_dir is None:
        raise ValueError("STS-B dev needs a data_dir")
    return score_task(load_task("STSBenchmark-dev", data_dir), encode)


def evaluate_sts(encode: Encode, data_dir: str | Path, tasks: tuple[str, ...] = TASKS) -> dict[str, float]:
    results = {name: score_task(load_task(name, data_dir), encode) for name in tasks}
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
    args = parser.parse_args(argv)

    embedder = load_embedder(args.url, args.model)
    results = evaluate_sts(embedder.encode, args.data_dir, tuple(args.tasks))
    print(format_table(embedder.name, results))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        source_desc = args.url or str(args.model)
        args.out.write_text(json.dumps({"model": embedder.name, "source": source_desc, "sts": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
