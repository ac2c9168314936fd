"""The seven STS tasks of the papers, read as SentEval reads them.

STS12–16 use SentEval's layout (STS.input.<subset>.txt tab-separated pairs, STS.gs.<subset>.txt
gold scores; an empty gold line means "unscored", the pair is skipped). In the "all" setting every
subset of a year is concatenated and scored with one Spearman. Sentences are whitespace-normalised
as SentEval does (split on whitespace, joined with single spaces).
"""

from __future__ import annotations

from pathlib import Path

from core.data import GET_DATA, DataNotFound, find_source_dir, read_sick
from core.sts import StsTask, make_task, read_stsb_split

STS_YEARS = ("STS12", "STS13", "STS14", "STS15", "STS16")
TASKS = (*STS_YEARS, "STSBenchmark", "SICKRelatedness")
#: the subsets SentEval scores per year (STS13's SMT is not distributed: it has a gold file, no input)
SENTEVAL_SUBSETS = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}


def _year_dir(data_dir: Path, year: str) -> Path:
    for rel in (f"senteval/STS/{year}-en-test", f"downstream/STS/{year}-en-test", f"STS/{year}-en-test",
                f"{year}-en-test"):
        if (data_dir / rel).is_dir():
            return data_dir / rel
    raise DataNotFound(f"no {year}-en-test folder under {data_dir}; {GET_DATA}")


def sts_year_subsets(folder: str | Path) -> list[str]:
    """Every subset with both an input and a gold file ('ALL' summary files are not subsets); on the
    SentEval folders these are exactly SENTEVAL_SUBSETS (the tests check it)."""
    folder = Path(folder)
    subsets = [g.name[len("STS.gs.") : -len(".txt")] for g in sorted(folder.glob("STS.gs.*.txt"))]
    return [s for s in subsets if s != "ALL" and (folder / f"STS.input.{s}.txt").is_file()]


def read_sts_year(folder: str | Path) -> list[tuple[str, str, float]]:
    """(s1, s2, gold) of every subset of a year, concatenated ("all" setting); as SentEval reads them:
    lines split on tabs, an empty gold line means the pair is unscored and is skipped."""
    folder = Path(folder)
    pairs = []
    for subset in sts_year_subsets(folder):
        gold = folder / f"STS.gs.{subset}.txt"
        inputs = folder / f"STS.input.{subset}.txt"
        lines = inputs.read_text(encoding="utf-8").splitlines()
        scores = gold.read_text(encoding="utf-8").splitlines()
        if len(lines) != len(scores):
            raise ValueError(f"{inputs} has {len(lines)} pairs but {gold} {len(scores)} scores")
        for line, score in zip(lines, scores):
            if score.strip():
                s1, s2 = line.split("\t")[:2]
                pairs.append((s1, s2, float(score)))
    return pairs


def read_sick_split(data_dir: str | Path, split: str = "test") -> list[tuple[str, str, float]]:
    """SICK as (s1, s2, relatedness 1–5); "test" is SentEval's SICK_test_annotated.txt (4,927 pairs)."""
    return [(p.sentence1, p.sentence2, p.label) for p in read_sick(find_source_dir("sick", data_dir), split)]


def load_task(name: str, data_dir: str | Path) -> StsTask:
    """One of TASKS (or "STSBenchmark-dev", the papers' model-selection set), whitespace-normalised.

    `data_dir` is a folder holding senteval/STS/... and senteval/SICK (the shared-data layout) or
    SentEval's downstream/ layout; see core.data.find_source_dir.
    """
    data_dir = Path(data_dir)
    if name in STS_YEARS:
        pairs = read_sts_year(_year_dir(data_dir, name))
    elif name == "STSBenchmark":
        pairs = read_stsb_split(data_dir, "test")
    elif name == "STSBenchmark-dev":
        pairs = read_stsb_split(data_dir, "dev")
    elif name == "SICKRelatedness":
        pairs = read_sick_split(data_dir, "test")
    else:
        raise ValueError(f"unknown STS task {name!r}; choose from {', '.join(TASKS)}")
    return make_task(name, pairs)
