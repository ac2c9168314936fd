"""Ranking metrics: hand-computed values on a graded fixture, and an independent implementation."""

import math

import numpy as np
import pytest

from core import beir
from core.ranking import evaluate_run, excluded_documents, keep_top, metric_names, per_query, ranked

# q1: graded judgements, d1 highly relevant (2), d2 and d5 relevant (1), d3 judged irrelevant (0);
#     d5 is never retrieved, d4 and d6 are unjudged.
# q2: three documents tie; trec_eval breaks ties by document id descending: c, b, a.
# q3: only an irrelevant judgement; q4: judged but absent from the run. Both count, as zeros.
QRELS = {"q1": {"d1": 2, "d2": 1, "d3": 0, "d5": 1}, "q2": {"a": 1}, "q3": {"x": 0}, "q4": {"y": 1}}
RUN = {
    "q1": {"d3": 0.9, "d1": 0.8, "d4": 0.7, "d2": 0.6, "d6": 0.5},
    "q2": {"b": 0.5, "a": 0.5, "c": 0.5},
    "q3": {"x": 1.0},
    "q9": {"d1": 1.0},  # a query nobody judged is not evaluated
}
L2 = math.log2


def test_ranking_is_trec_eval_order():
    assert ranked(RUN["q1"]) == ["d3", "d1", "d4", "d2", "d6"]
    assert ranked(RUN["q2"]) == ["c", "b", "a"]


def test_graded_fixture_by_hand():
    got = per_query(QRELS, RUN)
    assert set(got) == {"q1", "q2", "q3", "q4"}
    q1 = got["q1"]
    # ranking d3(0) d1(2) d4(-) d2(1) d6(-); the ideal ranking is 2, 1, 1 (d5 counts though unretrieved)
    idcg = 2 / L2(2) + 1 / L2(3) + 1 / L2(4)
    assert q1["nDCG@1"] == 0.0
    assert q1["nDCG@3"] == pytest.approx((2 / L2(3)) / (2 / L2(2) + 1 / L2(3) + 1 / L2(4)))
    assert q1["nDCG@5"] == pytest.approx((2 / L2(3) + 1 / L2(5)) / idcg)
    assert q1["nDCG@10"] == q1["nDCG@100"] == pytest.approx((2 / L2(3) + 1 / L2(5)) / idcg)
    assert q1["Recall@1"] == 0.0
    assert q1["Recall@5"] == pytest.approx(2 / 3)  # d1, d2 of d1, d2, d5
    assert q1["MRR@10"] == pytest.approx(1 / 2)
    assert q1["MAP"] == pytest.approx((1 / 2 + 2 / 4) / 3)  # hits at ranks 2 and 4, three relevant
    q2 = got["q2"]  # a is third
    assert q2["MRR@10"] == pytest.approx(1 / 3)
    assert q2["nDCG@3"] == pytest.approx(1 / L2(4))
    assert (q2["Recall@1"], q2["Recall@5"]) == (0.0, 1.0)
    assert q2["MAP"] == pytest.approx(1 / 3)
    assert all(v == 0.0 for q in ("q3", "q4") for v in got[q].values())


def test_average_over_every_judged_query():
    metrics = evaluate_run(QRELS, RUN)
    assert list(metrics) == metric_names()
    assert metrics["MRR@10"] == pytest.approx((1 / 2 + 1 / 3) / 4)
    assert metrics["Recall@5"] == pytest.approx((2 / 3 + 1) / 4)
    with pytest.raises(ValueError):
        evaluate_run({}, RUN)


def test_mrr_cut_at_ten():
    run = {f"d{i:02d}": 1.0 - i / 100 for i in range(12)}  # d00 best … d11 worst
    assert per_query({"q": {"d10": 1}}, {"q": run})["q"]["MRR@10"] == 0.0
    assert per_query({"q": {"d09": 1}}, {"q": run})["q"]["MRR@10"] == pytest.approx(1 / 10)


def reference_metrics(judged, ranking):
    """trec_eval's definitions, written out independently of pytrec_eval."""
    relevant = {d for d, r in judged.items() if r > 0}
    ideal = sorted((r for r in judged.values() if r > 0), reverse=True)
    out = {}
    for k in (1, 3, 5, 10, 100):
        dcg = sum(judged.get(d, 0) / L2(i + 2) for i, d in enumerate(ranking[:k]))
        idcg = sum(r / L2(i + 2) for i, r in enumerate(ideal[:k]))
        out[f"nDCG@{k}"] = dcg / idcg if idcg else 0.0
    for k in (1, 5, 10, 100):
        out[f"Recall@{k}"] = len(relevant & set(ranking[:k])) / len(relevant) if relevant else 0.0
    out["MRR@10"] = next((1 / (i + 1) for i, d in enumerate(ranking[:10]) if d in relevant), 0.0)
    hits = [i for i, d in enumerate(ranking) if d in relevant]
    out["MAP"] = sum((n + 1) / (i + 1) for n, i in enumerate(hits)) / len(relevant) if relevant else 0.0
    return out


def test_agrees_with_an_independent_implementation_on_random_graded_runs():
    rng = np.random.default_rng(0)
    docs = [f"d{i}" for i in range(150)]
    qrels, run = {}, {}
    for q in range(30):
        judged = rng.choice(docs, size=15, replace=False)
        qrels[f"q{q}"] = {str(d): int(rng.integers(0, 4)) for d in judged}
        retrieved = rng.choice(docs, size=120, replace=False)
        scores = np.round(rng.random(120), 2)  # rounded: many ties
        run[f"q{q}"] = {str(d): float(s) for d, s in zip(retrieved, scores)}
    ours = evaluate_run(qrels, run)
    theirs = [reference_metrics(qrels[q], ranked(run[q])) for q in qrels]
    for name in metric_names():
        assert ours[name] == pytest.approx(np.mean([t[name] for t in theirs]), abs=1e-9), name


def test_identical_ids_and_texts_are_dropped_before_scoring():
    corpus = {"q1": {"title": "", "text": "same  text"}, "d1": {"title": "", "text": "same text"},
              "d2": {"title": "", "text": "other"}, "d3": {"title": "", "text": "third"}}
    data = beir.BeirSet(corpus, {"q1": "same text"}, {"q1": {"d2": 1}})
    assert excluded_documents(data) == {"q1": {"q1"}}  # BEIR's default: identical ids only
    run = {"q1": {"q1": 1.0, "d1": 0.99, "d2": 0.5, "d3": 0.4}}
    assert list(keep_top(run, excluded_documents(data), depth=2)["q1"]) == ["d1", "d2"]
    data.protocol = beir.Protocol(ignore_identical_text=True)
    assert excluded_documents(data) == {"q1": {"q1", "d1"}}  # whitespace-normalised text
    assert list(keep_top(run, excluded_documents(data), depth=2)["q1"]) == ["d2", "d3"]
