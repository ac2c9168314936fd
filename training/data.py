"""Training examples: the three kinds of data the objectives consume, and their readers.

Readers take local paths (SentEval / STS-B / SICK layouts, the SimCSE NLI CSV, one-sentence-per-line
text); `../shared/data/` is one such source, never a hard-coded location.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PairExample:
    """A positive pair, with an optional hard negative (SimCSE's NLI CSV: sent0, sent1, hard_neg)."""

    anchor: str
    positive: str
    negative: str | None = None


@dataclass(frozen=True)
class ScoredPair:
    """Two sentences and a label: a similarity score, a 0/1 label, or an ordinal NLI label."""

    sentence1: str
    sentence2: str
    label: float


# What Objective.data_kind names, and the example type each kind yields.
DATA_KINDS = {"unlabeled": str, "pairs": PairExample, "scored": ScoredPair}
