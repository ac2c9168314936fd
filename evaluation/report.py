"""Compare models side by side: the JSON files of evaluation.sts / evaluation.retrieval → markdown + PNG.

    python -m evaluation.report results/*.json --out results/report
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RETRIEVAL_HEADLINE = ("nDCG@10", "Recall@1", "Recall@10", "MRR@10")


def collect(files: list[Path]) -> dict[str, dict[str, float]]:
    """model → {column: score × 100}; STS task names as they are, retrieval as '<set> <metric>'."""
    table: dict[str, dict[str, float]] = {}
    for f in files:
        data = json.loads(Path(f).read_text())
        row = table.setdefault(data["model"], {})
        if "sts" in data:
            row.update(data["sts"])
        if "retrieval" in data:
            row.update({f"{data['dataset']} {m}": 100 * data["retrieval"][m] for m in RETRIEVAL_HEADLINE})
    return table


def to_markdown(table: dict[str, dict[str, float]]) -> str:
    columns = list(dict.fromkeys(c for row in table.values() for c in row))
    lines = ["| model | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for model, row in table.items():
        lines.append(f"| {model} | " + " | ".join(f"{row[c]:.2f}" if c in row else "–" for c in columns) + " |")
    return "\n".join(lines) + "\n"


def bar_chart(table: dict[str, dict[str, float]], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    columns = list(dict.fromkeys(c for row in table.values() for c in row))
    x = np.arange(len(columns))
    width = 0.8 / max(1, len(table))
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(columns)), 4.5))
    for i, (model, row) in enumerate(table.items()):
        ax.bar(x + i * width, [row.get(c, 0) for c in columns], width, label=model)
    ax.set_xticks(x + width * (len(table) - 1) / 2, columns, rotation=35, ha="right")
    ax.set_ylabel("score × 100")
    ax.set_ylim(0, 100)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="JSON files written with --out")
    parser.add_argument("--out", type=Path, required=True, help="prefix: writes <out>.md, <out>.json, <out>.png")
    args = parser.parse_args(argv)
    table = collect(args.results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    markdown = to_markdown(table)
    args.out.with_suffix(".md").write_text(markdown)
    args.out.with_suffix(".json").write_text(json.dumps(table, indent=2))
    bar_chart(table, args.out.with_suffix(".png"))
    print(markdown, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
