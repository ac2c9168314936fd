"""Model selection: the trainer takes an evaluator object; train.py builds it from --select."""

import json
import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import spearmanr

from core import beir
from core.data import DataNotFound
from training.selection import Evaluator, make_evaluator

REPO = __import__("pathlib").Path(__file__).resolve().parent.parent


def _beir_set(folder, split="test", swap=False):
    docs = {"d0": "the cat sat on the mat", "d1": "stock markets fell sharply today",
            "d2": "a recipe for tomato soup", "d3": "the orbit of the moon around the earth"}
    # each query is its document's own text: any encoder ranks that document first (cosine 1)
    queries = {f"q{i}": text for i, text in enumerate(docs.values())}
    qrels = {f"q{i}": {f"d{(i + 1) % 4 if swap else i}": 1} for i in range(4)}
    beir.write(folder, beir.BeirSet({d: {"title": "", "text": t} for d, t in docs.items()}, queries, qrels,
                                    beir.Protocol(ignore_identical_ids=False)), split=split)
    return folder


def test_retrieval_selection_is_ndcg_at_10_through_the_harness(tiny_encoder, tmp_path):
    perfect = make_evaluator(f"retrieval:{_beir_set(tmp_path / 'a')}")
    assert isinstance(perfect, Evaluator) and perfect.name == f"retrieval:{tmp_path / 'a'}:test nDCG@10"
    assert perfect(tiny_encoder) == pytest.approx(100.0)

    from core.ranking import evaluate_run, search_in_process

    wrong = _beir_set(tmp_path / "b", split="dev", swap=True)
    got = make_evaluator(f"retrieval:{wrong}:dev")(tiny_encoder)

    class Enc:
        name = "tiny"
        encode = staticmethod(lambda texts: tiny_encoder.encode(texts))

    data = beir.load(wrong, "dev")
    expected = 100 * evaluate_run(data.qrels, search_in_process(Enc(), data, depth=10))["nDCG@10"]
    assert got == pytest.approx(expected) and got < 100.0


def test_retrieval_folder_is_found_under_the_data_dir(tiny_encoder, tmp_path):
    _beir_set(tmp_path / "beir" / "mine")
    ev = make_evaluator("retrieval:beir/mine", data_dir=tmp_path)
    assert ev(tiny_encoder) == pytest.approx(100.0)
    with pytest.raises(FileNotFoundError):
        make_evaluator("retrieval:beir/mine:validation", data_dir=tmp_path)  # no qrels/validation.tsv


def test_pairs_selection_is_spearman_of_cosines(tiny_encoder, tmp_path):
    rows = [("a man plays a guitar", "a person plays guitar", 4.8), ("a dog runs", "the stock market fell", 0.2),
            ("children play outside", "kids are playing outdoors", 4.5), ("a woman cooks", "a man sleeps", 1.0),
            ("the sun is bright", "it is a sunny day", 3.9)]
    path = tmp_path / "dev.tsv"
    path.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows))
    ev = make_evaluator(f"pairs:{path}")
    a = tiny_encoder.encode([r[0] for r in rows])
    b = tiny_encoder.encode([r[1] for r in rows])
    expected = 100 * spearmanr((a * b).sum(1), [r[2] for r in rows]).statistic
    assert ev.name == f"pairs:{path} Spearman"
    assert ev(tiny_encoder) == pytest.approx(expected, abs=1e-6)
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\ttwo\n")
    with pytest.raises(ValueError, match="bad.tsv:1"):
        make_evaluator(f"pairs:{bad}")


class LetterCounts:
    """A fast stand-in encoder (letter histograms): this test is about the wiring, not the model."""

    def encode(self, texts, batch_size=64, normalize=None):
        out = np.zeros((len(texts), 26), dtype=np.float32)
        for i, t in enumerate(texts):
            for c in t.lower():
                if "a" <= c <= "z":
                    out[i, ord(c) - 97] += 1
        return out + 1e-3


def test_stsb_dev_selection_is_the_harness_stsb_dev(shared_data):
    from core.sts import stsb_dev_spearman

    ev = make_evaluator("stsb-dev", data_dir=shared_data)
    assert ev.name == "STS-B dev Spearman"
    enc = LetterCounts()
    assert ev(enc) == pytest.approx(stsb_dev_spearman(enc.encode, shared_data))
    with pytest.raises(DataNotFound, match="needs --data-dir .* `make data`"):  # names the command that gets it
        make_evaluator("stsb-dev")


def test_last_always_prefers_the_latest_evaluation(tiny_encoder):
    ev = make_evaluator("last")
    scores = [ev(tiny_encoder) for _ in range(3)]
    assert scores == sorted(scores) and len(set(scores)) == 3


def test_unknown_selection_is_refused():
    with pytest.raises(ValueError, match="stsb-dev"):
        make_evaluator("mteb:whatever")


class Scripted:
    """An evaluator with fixed answers: the trainer must keep the step it scored highest."""

    name = "scripted"

    def __init__(self, scores):
        self.scores = list(scores)

    def __call__(self, encoder):
        return self.scores.pop(0)


@pytest.mark.slow  # two trainer runs of 6 steps
def test_trainer_keeps_the_checkpoint_the_injected_evaluator_scores_best(tiny_model_dir, shared_data, tmp_path):
    from training.config import make_config
    from training.trainer import train

    cfg = make_config("simcse", "quick", base_model=str(tiny_model_dir), data_dir=shared_data,
                      train_data="text:corpus/wordnet-sentences.txt", train_limit=32, batch_size=8, epochs=4,
                      max_steps=6, eval_every=2, max_seq_length=16, lr=1e-3)
    result = train(cfg, tmp_path / "run", log=lambda *_: None, evaluator=Scripted([1.0, 7.0, 3.0, 2.0]))
    assert (result.best_step, result.best_dev, result.initial_dev) == (2, 7.0, 1.0)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["dev"], r["select"]) for r in rows if "dev" in r] == [
        (0, 1.0, "scripted"), (2, 7.0, "scripted"), (4, 3.0, "scripted"), (6, 2.0, "scripted")]
    assert (tmp_path / "run" / "best" / "modules.json").is_file()

    last = train(cfg, tmp_path / "last", log=lambda *_: None, evaluator=make_evaluator("last"))
    assert last.best_step == 6


def test_train_cli_and_config_carry_the_selection(tmp_path):
    from training.train import build_config

    cfg = build_config(["--method", "simcse", "--select", "retrieval:data/beir/mine:dev"])
    assert cfg.select == "retrieval:data/beir/mine:dev"
    assert build_config(["--method", "cosent"]).select == "stsb-dev"
    dry = subprocess.run(["make", "-n", "train-export", "SELECT=pairs:my dev.tsv", "VENV=/nonexistent"],
                         cwd=REPO, capture_output=True, text=True)
    assert "--select 'pairs:my dev.tsv'" in dry.stdout, dry.stdout + dry.stderr


@pytest.mark.slow  # a fresh interpreter importing torch and transformers
def test_training_does_not_import_evaluation_at_import_time():
    code = ("import sys, training.trainer, training.train, training.selection, export.exporter; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'evaluation'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------- keeping a later checkpoint only beyond noise ----------
def test_keep_rule_first_evaluation_is_the_base_and_a_lower_score_never_wins():
    from training.selection import KeepRule

    rule = KeepRule()
    assert rule.decide(40.0, float("-inf"), None).keep
    assert not rule.decide(41.0, 42.0, 40.0).keep


def test_keep_rule_margin_is_points_over_the_base():
    from training.selection import KeepRule

    rule = KeepRule(margin=1.0)
    small, large = rule.decide(40.9, 40.0, 40.0), rule.decide(41.5, 40.0, 40.0)
    assert not small.keep and "margin" in small.rule
    assert large.keep and "+1.50" in large.rule


def test_paired_bootstrap_refuses_noise_and_keeps_a_real_gain():
    from training.selection import KeepRule, paired_bootstrap_lower

    rng = np.random.default_rng(0)
    base = rng.uniform(0, 100, 150)
    centred = lambda sd: (e := rng.normal(0, sd, 150)) - e.mean()  # noqa: E731
    noise = base + 0.2 + centred(30)  # +0.2 on average, 30 points of per-query noise: no evidence
    real = base + 5.0 + centred(10)  # +5 on average with less noise
    rule = KeepRule()
    refused = rule.decide(float(noise.mean()), float(base.mean()), float(base.mean()), list(noise), list(base))
    kept = rule.decide(float(real.mean()), float(base.mean()), float(base.mean()), list(real), list(base))
    assert not refused.keep and "paired bootstrap over 150 dev items" in refused.rule
    assert kept.keep and "lower bound" in kept.rule
    # the bound is a quantile of resampled mean gains: below the observed gain, deterministic for a seed
    low = paired_bootstrap_lower(list(real), list(base))
    assert 0 < low < real.mean() - base.mean() and low == paired_bootstrap_lower(list(real), list(base))


def test_keep_rule_without_item_scores_keeps_any_higher_score():
    from training.selection import KeepRule

    decision = KeepRule().decide(40.1, 40.0, 40.0)
    assert decision.keep and "no per-item" in decision.rule


def test_retrieval_evaluator_gives_a_score_per_query(tiny_encoder, tmp_path):
    ev = make_evaluator(f"retrieval:{_beir_set(tmp_path / 'a')}")
    assert ev(tiny_encoder) == pytest.approx(100.0)
    assert ev.item_scores == pytest.approx([100.0] * 4)


class ScriptedItems(Scripted):
    """Per-item scores too: the mean is the score, as a retrieval evaluator's."""

    def __call__(self, encoder):
        self.item_scores = self.scores.pop(0)
        return float(np.mean(self.item_scores))


@pytest.mark.slow  # two trainer runs
def test_trainer_refuses_a_gain_it_cannot_tell_from_noise_and_logs_the_rule(tiny_model_dir, shared_data, tmp_path):
    from training.config import make_config
    from training.trainer import train

    rng = np.random.default_rng(1)
    base = rng.uniform(0, 100, 150)
    e = rng.normal(0, 40, 150)
    noisy = list(base + 1.0 + e - e.mean())  # +1.0 on average, 40 points of per-query noise
    cfg = make_config("simcse", "quick", base_model=str(tiny_model_dir), data_dir=shared_data,
                      train_data="text:corpus/wordnet-sentences.txt", train_limit=16, batch_size=8, epochs=1,
                      max_steps=2, eval_every=2, max_seq_length=16)
    lines = []
    result = train(cfg, tmp_path / "run", log=lines.append, evaluator=ScriptedItems([list(base), noisy]))
    assert result.best_step == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["kept"]) for r in rows if "dev" in r] == [(0, True), (2, False)]
    assert any("paired bootstrap" in line and "not kept" in line for line in lines)
    assert "decided by: first evaluation" in lines[-1]

    cfg.select_margin = -100.0  # a user-set margin decides instead
    result = train(cfg, tmp_path / "margin", log=lines.append, evaluator=ScriptedItems([list(base), noisy]))
    assert result.best_step == 2 and "decided by: margin" in lines[-1]


@pytest.mark.parametrize(("scores", "best_pooling", "initial"), [
    ([1.0, 5.0, 4.0], "mean", 5.0),  # the model as saved scores higher: it is best/ and the base to beat
    ([5.0, 1.0, 4.0], "cls", 5.0),  # the run's step 0 scores higher: it stays the base
])
def test_a_run_that_changes_the_model_measures_gains_from_the_better_of_step_0_and_the_saved_base(
        tiny_model_dir, shared_data, tmp_path, scores, best_pooling, initial):
    """A pooling override (CLS on a mean-pooled model) makes step 0 another model than the base as saved: the
    selection scores both, so an export is never below the base the user started from only because step 0 was.
    (A run whose step 0 is the saved model evaluates it once: the test above would run out of scores.)"""
    from core.encoder import SentenceEncoder
    from training.config import make_config
    from training.trainer import train

    cfg = make_config("simcse", "quick", base_model=str(tiny_model_dir), data_dir=shared_data,
                      train_data="text:corpus/wordnet-sentences.txt", train_limit=16, batch_size=8, epochs=1,
                      max_steps=2, eval_every=2, max_seq_length=16, objective={"pooling": "cls"})
    lines: list[str] = []
    result = train(cfg, tmp_path / "run", log=lines.append, evaluator=Scripted(scores))
    assert (result.best_step, result.best_dev, result.initial_dev) == (0, initial, initial)
    assert SentenceEncoder.from_pretrained(tmp_path / "run" / "best").pooling == best_pooling
    assert any("step 0 is not the base model as saved" in line and "mean pooling" in line for line in lines)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"step": 0, "dev_saved_base": scores[1], "kept": best_pooling == "mean"} in rows
