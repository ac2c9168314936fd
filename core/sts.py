"""STS scoring as SentEval/SimCSE run it: Spearman × 100 of cosine similarity against gold.

Shared by the harness (evaluation.sts scores the seven STS tasks) and the trainer's model selection
(training.selection scores STS-B dev): one implementation, so a run's dev score and the report's
STS-B column are computed the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
from scipy.stats import spearmanr

from core.data import find_source_dir, read_stsb

Encode = Callable[[list[str]], np.ndarray]
ScorePairs = Callable[[list[str], list[str]], np.ndarray]


@runtime_checkable
class TextEncoder(Protocol):
    """Anything with `encode(texts) -> [n, d]`: the harness's embedders, a model being trained."""

    def encode(self, texts: list[str]) -> np.ndarray: ...


@dataclass
class StsTask:
    name: str
    sentences1: list[str]
    sentences2: list[str]
    scores: list[float]

    def __len__(self) -> int:
        return len(self.scores)


def normalize(sentence: str) -> str:
    """SentEval's tokenisation (`s.split()`) joined back with single spaces, as SimCSE's batcher does."""
    return " ".join(sentence.split())


def make_task(name: str, pairs: list[tuple[str, str, float]]) -> StsTask:
    """A task from (s1, s2, gold) rows, sentences whitespace-normalised."""
    return StsTask(name, [normalize(a) for a, _, _ in pairs], [normalize(b) for _, b, _ in pairs],
                   [s for _, _, s in pairs])


def read_stsb_split(data_dir: str | Path, split: str = "test") -> list[tuple[str, str, float]]:
    """STS-B sts-<split>.csv as (s1, s2, score 0–5): tab separated, csv.QUOTE_NONE, extra fields ignored."""
    return [(p.sentence1, p.sentence2, p.label) for p in read_stsb(find_source_dir("stsb", data_dir), split)]


def stsb_dev_task(data_dir: str | Path | None) -> StsTask:
    """STS-B dev, the papers' model-selection set."""
    if data_dir is None:
        raise ValueError("STS-B dev needs a data_dir")
    return make_task("STSBenchmark-dev", read_stsb_split(data_dir, "dev"))


def cosine_scores(encode: Encode, task: StsTask) -> np.ndarray:
    """Cosine of each pair; every distinct sentence is embedded once (embeddings need not be unit)."""
    unique = list(dict.fromkeys(task.sentences1 + task.sentences2))
    vectors = np.asarray(encode(unique), dtype=np.float64)
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-12)
    row = {s: i for i, s in enumerate(unique)}
    a = vectors[[row[s] for s in task.sentences1]]
    b = vectors[[row[s] for s in task.sentences2]]
    return np.asarray((a * b).sum(axis=1))


def spearman(scores: np.ndarray | list[float], gold: list[float]) -> float:
    """Spearman × 100."""
    return float(100 * spearmanr(scores, gold).statistic)


def score_task(task: StsTask, embedder: TextEncoder | Encode) -> float:
    """Spearman × 100 between the pairs' cosine similarities and the gold scores."""
    encode = embedder.encode if isinstance(embedder, TextEncoder) else embedder
    return spearman(cosine_scores(encode, task), task.scores)


def score_task_pairs(task: StsTask, score_pairs: ScorePairs) -> float:
    """Spearman × 100 of a cross-encoder's own pair scores (no cosine) against the gold scores."""
    return spearman(np.asarray(score_pairs(task.sentences1, task.sentences2), dtype=np.float64), task.scores)


def stsb_dev_spearman(encode: TextEncoder | Encode, data_dir: str | Path | None) -> float:
    """STS-B dev Spearman × 100: the papers' model-selection metric."""
    return score_task(stsb_dev_task(data_dir), encode)


def stsb_dev_pair_spearman(score_pairs: ScorePairs, data_dir: str | Path | None) -> float:
    """STS-B dev Spearman × 100 of a cross-encoder's own pair scores: its model selection."""
    return score_task_pairs(stsb_dev_task(data_dir), score_pairs)
