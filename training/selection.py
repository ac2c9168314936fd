"""Model selection: which checkpoint a run keeps as best/, measured on the user's choice of dev set.

    --select stsb-dev                       STS-B dev Spearman × 100 (the papers' choice; the default)
    --select retrieval:<BEIR folder>[:split] nDCG@10 × 100 on qrels/<split>.tsv (default split: dev if
                                            the folder has one, else test), exact search (core.ranking)
    --select pairs:<file.tsv>               Spearman × 100 of cosine against gold on tab-separated
                                            sentence1, sentence2, score rows (a header row is skipped)
    --select last                           no dev set: the last evaluation always wins

Which evaluation becomes best/ (`KeepRule`, TrainConfig's `select_margin` / `select_confidence`): the
first (step 0, the base model) always; a later one only when it scores above the current best *and*
its gain over the base is beyond noise: with `select_margin` set, a gain above that many points; else,
where the evaluator gives a score per dev item (retrieval: each query's nDCG@10), a paired bootstrap
over those items whose one-sided `select_confidence` lower bound of the gain is above 0; else (STS
Spearman, last) any higher score. The log and metrics.jsonl say which rule decided and why.

`Selector` applies them over a run: the trainer hands it the model at step 0 (and the base model as
saved, which it also scores when step 0 computes other vectors) and at each evaluation step.

The trainer sees only the `Evaluator` protocol (a name, and `evaluator(encoder) -> float`, higher is
better), as sentence-transformers' trainer takes a SentenceEvaluator. The measurements come from the
shared layer below training and evaluation (core.sts: STS Spearman; core.beir + core.ranking: BEIR
sets, exact search, nDCG), the same code the evaluation harness reports with, so training never
imports evaluation (the import contracts in pyproject.toml check it). A caller with another measure
passes its own Evaluator to training.trainer.train. A relative path that does not exist as given is
looked up under data_dir.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from core import beir
from core.data import GET_DATA, DataNotFound
from core.encoder import SentenceEncoder
from core.ranking import evaluate_run, per_query, search_in_process
from core.sts import StsTask, score_task, score_task_pairs, stsb_dev_pair_spearman, stsb_dev_spearman
from training.resume import TrainState

EVAL_BATCH_SIZE = 128  # inference only: larger batches than training, still small on a CPU
RETRIEVAL_DEPTH = 10  # nDCG@10 needs the top 10 only


@runtime_checkable
class Evaluator(Protocol):
    name: str

    def __call__(self, encoder: SentenceEncoder) -> float: ...


class _Embedder:
    """core.sts.TextEncoder over the encoder being trained (eval mode, normalised)."""

    def __init__(self, encoder: SentenceEncoder):
        self.encoder = encoder

    def encode(self, texts: list[str]):
        return self.encoder.encode(list(texts), batch_size=EVAL_BATCH_SIZE, normalize=True)


class StsbDev:
    name = "STS-B dev Spearman"

    def __init__(self, data_dir: str | Path | None):
        if data_dir is None:
            raise DataNotFound(f"--select stsb-dev needs --data-dir (a folder holding STS-B); {GET_DATA}")
        self.data_dir = data_dir

    def __call__(self, encoder: SentenceEncoder) -> float:
        if hasattr(encoder, "score_pairs"):  # a cross-encoder: Spearman of its own pair scores
            return stsb_dev_pair_spearman(lambda a, b: encoder.score_pairs(a, b, batch_size=EVAL_BATCH_SIZE),
                                          self.data_dir)
        return stsb_dev_spearman(_Embedder(encoder).encode, self.data_dir)


class PairsSpearman:
    def __init__(self, path: Path):
        rows = []
        with open(path, encoding="utf-8", newline="") as f:
            for line_no, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
                if not row or not "".join(row).strip():
                    continue
                try:
                    if len(row) != 3:
                        raise ValueError
                    rows.append((row[0], row[1], float(row[2])))
                except ValueError:
                    if line_no == 1 and len(row) == 3:
                        continue  # a header
                    raise ValueError(f"{path}:{line_no}: expected sentence1<TAB>sentence2<TAB>score, "
                                     f"got {row!r}") from None
        if len(rows) < 3:
            raise ValueError(f"{path}: {len(rows)} scored pairs; a Spearman needs at least 3")
        self.task = StsTask(path.name, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
        self.name = f"pairs:{path} Spearman"

    def __call__(self, encoder: SentenceEncoder) -> float:
        if hasattr(encoder, "score_pairs"):  # a cross-encoder: Spearman of its own pair scores
            return score_task_pairs(self.task, lambda a, b: encoder.score_pairs(a, b, batch_size=EVAL_BATCH_SIZE))
        return score_task(self.task, _Embedder(encoder).encode)


class RetrievalNdcg:
    def __init__(self, folder: Path, split: str):
        self.data = beir.load(folder, split)  # once: the folder is read before training starts
        self.name = f"retrieval:{folder}:{split} nDCG@10"

    def __call__(self, encoder: SentenceEncoder) -> float:
        if hasattr(encoder, "score_pairs"):
            raise ValueError(f"{self.name} needs embeddings; a cross-encoder is selected with stsb-dev or pairs:")
        run = search_in_process(_Embedder(encoder), self.data, depth=RETRIEVAL_DEPTH)
        values = per_query(self.data.qrels, run)
        self.item_scores = [100 * values[q]["nDCG@10"] for q in sorted(values)]  # paired across evaluations
        return 100 * evaluate_run(self.data.qrels, run)["nDCG@10"]


#: one-sided confidence of the paired bootstrap (TrainConfig.select_confidence): 95 %, the usual test level
BOOTSTRAP_CONFIDENCE = 0.95
#: resamples of the dev items (pairs kept): enough for a stable 5 % quantile on a few hundred queries
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class Decision:
    keep: bool
    rule: str  # which rule decided, with its numbers: goes to the log and metrics.jsonl


@dataclass(frozen=True)
class KeepRule:
    """Whether an evaluation replaces best/ (module docstring). margin: points over the base, or None for the
    paired bootstrap (when the evaluator gives per-item scores, else any higher score)."""

    margin: float | None = None
    confidence: float = BOOTSTRAP_CONFIDENCE
    resamples: int = BOOTSTRAP_RESAMPLES
    seed: int = 0

    def decide(self, score: float, best: float, base: float | None,
               items: list[float] | None = None, base_items: list[float] | None = None) -> Decision:
        if base is None or not math.isfinite(best):
            return Decision(True, "first evaluation: the base model")
        if score <= best:
            return Decision(False, f"not above the best so far ({score:.2f} ≤ {best:.2f})")
        gain = score - base
        if self.margin is not None:
            keep = gain > self.margin
            return Decision(keep, f"margin: gain over base {gain:+.2f} {'>' if keep else '≤'} {self.margin:g}")
        if items is None or base_items is None or len(items) != len(base_items) or len(items) < 2:
            return Decision(True, "higher score (no per-item dev scores for a noise test)")
        low = paired_bootstrap_lower(items, base_items, self.confidence, self.resamples, self.seed)
        keep = low > 0
        return Decision(keep, f"paired bootstrap over {len(items)} dev items: gain over base {gain:+.2f}, "
                              f"{self.confidence:.0%} lower bound {low:+.2f} {'>' if keep else '≤'} 0")


#: sentences whose vectors tell whether a run's step 0 is the base model as saved
_PROBES = ["A man is playing a guitar.", "The committee approved the budget for next year.", "Hi"]


class Selector:
    """Keeps best/ over a run: scores each evaluation with `evaluator`, lets `rule` decide whether it replaces
    best/, and keeps the outcome in the run's TrainState (so a resume carries on with it), `record` (a
    metrics.jsonl row) and `log`."""

    def __init__(self, evaluator: Evaluator, rule: KeepRule, best_dir: Path, state: TrainState,
                 record: Callable[[dict[str, Any]], None], log: Callable[[str], None]):
        self.evaluator, self.rule, self.best_dir, self.state = evaluator, rule, best_dir, state
        self.record, self.log = record, log

    @property
    def name(self) -> str:
        return self.evaluator.name

    def evaluate(self, model: SentenceEncoder, step: int) -> float:
        state = self.state
        dev = float(self.evaluator(model))
        items = getattr(self.evaluator, "item_scores", None)
        first = not math.isfinite(state.best_dev)
        decision = self.rule.decide(dev, state.best_dev, None if first else state.initial_dev, items,
                                    state.base_items)
        if first:
            state.base_items = None if items is None else list(items)
        self.record({"step": step, "dev": dev, "select": self.name, "kept": decision.keep, "rule": decision.rule})
        self.log(f"[select] step {step}: {self.name} {dev:.2f} {'kept' if decision.keep else 'not kept'}"
                 f" ({decision.rule})")
        if decision.keep:
            state.best_dev, state.best_step, state.best_rule = dev, step, decision.rule
            model.save_pretrained(self.best_dir)
        return dev

    def start(self, step0: SentenceEncoder, base: SentenceEncoder | None, base_name: str) -> None:
        """Step 0: the run's model before training becomes best/ and the base. `base` (the base model as saved,
        on the CPU) is scored too when step 0 computes other vectors: a pooling override (all-MiniLM-L6-v2 with
        CLS pooling instead of its mean) or a head that starts untrained (CLSR's random e). When it scores
        higher it is best/ and the base every later evaluation must beat beyond noise. A pair scorer's step 0
        has no such base."""
        state = self.state
        state.initial_dev = self.evaluate(step0, 0)
        self.log(f"[train] step 0 {self.name} {state.initial_dev:.2f}")
        if base is None or not isinstance(step0, SentenceEncoder):
            return
        ours, theirs = step0.encode(_PROBES), base.encode(_PROBES)
        if ours.shape == theirs.shape and np.allclose(ours, theirs, atol=1e-5):
            return
        saved_dev = float(self.evaluator(base.to(step0.device)))
        better = saved_dev > state.initial_dev
        self.record({"step": 0, "dev_saved_base": saved_dev, "kept": better})
        self.log(f"[select] step 0 is not the base model as saved ({base_name}, {base.pooling} pooling), which "
                 f"scores {saved_dev:.2f}: " + ("kept as best/, and the base every later checkpoint must beat "
                                                "beyond noise" if better else "step 0 stays the base"))
        if better:
            state.initial_dev = state.best_dev = saved_dev
            items = getattr(self.evaluator, "item_scores", None)
            state.base_items = None if items is None else list(items)
            state.best_rule = "the base model as saved: the run's step 0 scored lower"
            base.save_pretrained(self.best_dir)


def paired_bootstrap_lower(items: list[float], base_items: list[float], confidence: float = BOOTSTRAP_CONFIDENCE,
                           resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> float:
    """One-sided lower confidence bound of mean(items − base_items), resampling the items (pairs kept)."""
    diff = np.asarray(items, dtype=np.float64) - np.asarray(base_items, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(resamples, len(diff)))].mean(1)
    return float(np.quantile(means, 1 - confidence))


class Last:
    """No dev set: each evaluation scores higher than any before it, so best/ is the last model.

    The score is the evaluation's wall-clock time (seconds since the epoch), not a counter, so it
    stays above the best score a resumed run restores from its checkpoint.
    """

    name = "last (evaluation time)"

    def __init__(self):
        self._previous = -math.inf

    def __call__(self, encoder: SentenceEncoder) -> float:
        self._previous = max(time.time(), self._previous + 1e-3)
        return self._previous


def _existing(path: str, data_dir: str | Path | None) -> Path:
    p = Path(path)
    if not p.exists() and data_dir is not None and (Path(data_dir) / p).exists():
        return Path(data_dir) / p
    return p


def make_evaluator(spec: str, data_dir: str | Path | None = None) -> Evaluator:
    """The evaluator `spec` names (see the module docstring)."""
    kind, _, arg = spec.partition(":")
    if kind == "stsb-dev" and not arg:
        return StsbDev(data_dir)
    if kind == "last" and not arg:
        return Last()
    if kind == "pairs" and arg:
        path = _existing(arg, data_dir)
        if not path.is_file():
            raise FileNotFoundError(f"--select {spec}: {path} is not a file")
        return PairsSpearman(path)
    if kind == "retrieval" and arg:
        folder, split = _existing(arg, data_dir), None
        if not folder.is_dir() and ":" in arg:  # retrieval:<folder>:<split>
            head, _, split = arg.rpartition(":")
            folder = _existing(head, data_dir)
        if split is None:
            split = "dev" if (folder / "qrels" / "dev.tsv").is_file() else "test"
        return RetrievalNdcg(folder, split)
    raise ValueError(f"unknown --select {spec!r}; choose from stsb-dev, retrieval:<BEIR folder>[:split], "
                     "pairs:<tsv file>, last")
