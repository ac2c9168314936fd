"""The seven STS tasks of the papers, read as SentEval reads them.

STS12–16 use SentEval's layout (STS.input.<subset>.txt tab-separated pairs, STS.gs.<subset>.txt
gold scores; an empty gold line means "unscored", the pair is skipped). In the "all" setting every
subset of a year is concatenated and scored with one Spearman. Sentences are whitespace-normalised
as SentEval does (split on whitespace, joined with single spaces).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from training.data import find_source_dir, read_sick, read_stsb

STS_YEARS = ("STS12", "STS13", "STS14", "STS15", "STS16")
TASKS = (*STS_YEARS, "STSBenchmark", "SICKRelatedness")


@dataclass
class StsTask:
    name: str
    sentences1: list[str]
    sentences2: list[str]
    scores: list[float]

    def __len__(self) -> int:
        return len(self.scores)


def normalize(sentence: str) -> str:
    return " ".join(sentence.split())


def _year_dir(data_dir: Path, year: str) -> Path:
    for rel in (f"senteval/STS/{year}-en-test", f"downstream/STS/{year}-en-test", f"STS/{year}-en-test",
                f"{year}-en-test"):
        if (data_dir / rel).is_dir():
            return data_dir / rel
    raise FileNotFoundError(f"no {year}-en-test folder under {data_dir}")


def read_sts_year(folder: Path) -> list[tuple[str, str, float]]:
    """Every subset with both an input and a gold file ('ALL' summary files are not subsets)."""
    pairs = []
    for gold in sorted(folder.glob("STS.gs.*.txt")):
        subset = gold.name[len("STS.gs.") : -len(".txt")]
        inputs = folder / f"STS.input.{subset}.txt"
        if subset == "ALL" or not inputs.is_file():
            continue
        lines = inputs.read_text(encoding="utf-8").splitlines()
        scores = gold.read_text(encoding="utf-8").splitlines()
        if len(lines) != len(scores):
            raise ValueError(f"{inputs} has {len(lines)} pairs but {gold} {len(scores)} scores")
        for line, score in zip(lines, scores):
            if score.strip():
                s1, s2 = line.split("\t")[:2]
                pairs.append((s1, s2, float(score)))
    return pairs


def load_task(name: str, data_dir: str | Path) -> StsTask:
    data_dir = Path(data_dir)
    if name in STS_YEARS:
        pairs = read_sts_year(_year_dir(data_dir, name))
    elif name == "STSBenchmark":
        pairs = [(p.sentence1, p.sentence2, p.label) for p in read_stsb(find_source_dir("stsb", data_dir), "test")]
    elif name == "STSBenchmark-dev":
        pairs = [(p.sentence1, p.sentence2, p.label) for p in read_stsb(find_source_dir("stsb", data_dir), "dev")]
    elif name == "SICKRelatedness":
        pairs = [(p.sentence1, p.sentence2, p.label) for p in read_sick(find_source_dir("sick", data_dir), "test")]
    else:
        raise ValueError(f"unknown STS task {name!r}; choose from {', '.join(TASKS)}")
    return StsTask(name, [normalize(a) for a, _, _ in pairs], [normalize(b) for _, b, _ in pairs],
                   [s for _, _, s in pairs])
