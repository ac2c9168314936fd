"""Compare models side by side: the JSON files of evaluation.sts / evaluation.retrieval → markdown,
JSON and a grouped bar chart (PNG), one row / one bar colour per model.

    python -m evaluation.report results/*/*.json --out results/report

A row is a result file's "label" (the model name, "(service)" added for results taken over REST), so
the same model measured in process and through the service stays two rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RETRIEVAL_HEADLINE = ("nDCG@10", "Recall@1", "Recall@5", "Recall@10", "MRR@10")
STS_ORDER = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness", "avg")
SHORT = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R", "avg": "STS avg"}


def collect(files: list[Path]) -> tuple[dict[str, dict[str, float]], list[str], list[str]]:
    """(rows, STS columns, retrieval columns); rows map label → {column: score × 100}."""
    table: dict[str, dict[str, float]] = {}
    sts_cols: list[str] = []
    ret_cols: list[str] = []
    for f in files:
        data = json.loads(Path(f).read_text())
        row = table.setdefault(data.get("label") or data["model"], {})
        if "sts" in data:
            for task, score in data["sts"].items():
                col = SHORT.get(task, task)
                row[col] = score
                sts_cols.append(col)
        if "retrieval" in data:
            dataset = data["dataset"].removesuffix("-retrieval")
            for m in RETRIEVAL_HEADLINE:
                if m in data["retrieval"]:
                    row[f"{dataset} {m}"] = 100 * data["retrieval"][m]
                    ret_cols.append(f"{dataset} {m}")
    order = {SHORT.get(t, t): i for i, t in enumerate(STS_ORDER)}
    sts_cols = sorted(dict.fromkeys(sts_cols), key=lambda c: order.get(c, len(order)))
    return table, sts_cols, list(dict.fromkeys(ret_cols))


def to_markdown(table: dict[str, dict[str, float]], columns: list[str]) -> str:
    lines = ["| model | " + " | ".join(columns) + " |", "|---" + "|---:" * len(columns) + "|"]
    for model, row in table.items():
        lines.append(f"| {model} | " + " | ".join(f"{row[c]:.2f}" if c in row else "–" for c in columns) + " |")
    return "\n".join(lines) + "\n"


def bar_chart(table: dict[str, dict[str, float]], panels: list[tuple[str, list[str]]], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    panels = [(title, cols) for title, cols in panels if cols]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8, 0.75 * max(len(c) for _, c in panels) + 3),
                                                      4.2 * len(panels)), squeeze=False)
    width = 0.8 / max(1, len(table))
    for ax, (title, columns) in zip(axes[:, 0], panels):
        x = np.arange(len(columns))
        for i, (model, row) in enumerate(table.items()):
            values = [row.get(c, np.nan) for c in columns]
            ax.bar(x + (i - (len(table) - 1) / 2) * width, values, width, label=model)
        ax.set_xticks(x, columns, rotation=30, ha="right")
        ax.set_title(title)
        ax.set_ylabel("score × 100")
        ax.set_ylim(0, 100)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    rows = -(-len(labels) // 3)
    fig.legend(handles, labels, loc="upper center", ncol=min(3, len(labels)), fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.035 * rows / len(panels)))
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="JSON files written by the CLIs' --out")
    parser.add_argument("--out", type=Path, required=True, help="prefix: writes <out>.md, <out>.json, <out>.png")
    args = parser.parse_args(argv)
    table, sts_cols, ret_cols = collect(args.results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    parts = []
    if sts_cols:
        parts.append("### STS (Spearman × 100)\n\n" + to_markdown(table, sts_cols))
    if ret_cols:
        parts.append("### Retrieval (× 100)\n\n" + to_markdown(table, ret_cols))
    markdown = "\n".join(parts)
    args.out.with_suffix(".md").write_text(markdown)
    args.out.with_suffix(".json").write_text(json.dumps(table, indent=2) + "\n")
    bar_chart(table, [("STS: Spearman × 100", sts_cols), ("Retrieval", ret_cols)], args.out.with_suffix(".png"))
    print(markdown, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
