"""Ranking metrics: hand-computed values on a graded fixture, and agreement with pytrec_eval."""

import math

import numpy as np
import pytest
import pytrec_eval

from evaluation.metrics import average_precision, evaluate_run, mrr_at_k, ndcg_at_k, ranked, recall_at_k

# One query, graded judgements: d1 highly relevant (2), d2 and d5 relevant (1), d3 judged irrelevant (0).
JUDGED = {"d1": 2, "d2": 1, "d3": 0, "d5": 1}
RUN = {"d3": 0.9, "d1": 0.8, "d4": 0.7, "d2": 0.6, "d6": 0.5}  # d5 is never retrieved


def test_ranking_orders_by_score():
    assert ranked(RUN) == ["d3", "d1", "d4", "d2", "d6"]


def test_ndcg_by_hand():
    # DCG@3 = 0/log2(2) + 2/log2(3) + 0/log2(4); ideal = 2/log2(2) + 1/log2(3) + 1/log2(4)
    dcg3 = 2 / math.log2(3)
    idcg3 = 2 + 1 / math.log2(3) + 1 / 2
    assert ndcg_at_k(ranked(RUN), JUDGED, 3) == pytest.approx(dcg3 / idcg3)
    assert ndcg_at_k(ranked(RUN), JUDGED, 1) == 0.0
    dcg5 = 2 / math.log2(3) + 1 / math.log2(5)
    assert ndcg_at_k(ranked(RUN), JUDGED, 5) == pytest.approx(dcg5 / idcg3)  # ideal has only 3 relevant


def test_recall_mrr_map_by_hand():
    ranking = ranked(RUN)
    assert recall_at_k(ranking, JUDGED, 1) == 0.0
    assert recall_at_k(ranking, JUDGED, 2) == pytest.approx(1 / 3)
    assert recall_at_k(ranking, JUDGED, 5) == pytest.approx(2 / 3)
    assert mrr_at_k(ranking, JUDGED, 10) == pytest.approx(1 / 2)
    assert mrr_at_k(ranking, JUDGED, 1) == 0.0
    # relevant at ranks 2 and 4: (1/2 + 2/4) / 3 relevant
    assert average_precision(ranking, JUDGED) == pytest.approx((1 / 2 + 2 / 4) / 3)


def test_queries_without_relevant_documents_are_skipped():
    qrels = {"q1": JUDGED, "q2": {"d1": 0}}
    metrics = evaluate_run(qrels, {"q1": RUN, "q2": {"d1": 1.0}})
    assert metrics["MRR@10"] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        evaluate_run({"q": {"d": 0}}, {"q": {"d": 1.0}})


def test_agrees_with_pytrec_eval_on_random_runs():
    rng = np.random.default_rng(0)
    docs = [f"d{i}" for i in range(60)]
    qrels, run = {}, {}
    for q in range(25):
        judged = rng.choice(docs, size=12, replace=False)
        qrels[f"q{q}"] = {d: int(rng.integers(0, 4)) for d in judged}
        qrels[f"q{q}"][str(judged[0])] = 3  # at least one relevant
        retrieved = rng.choice(docs, size=40, replace=False)
        run[f"q{q}"] = {str(d): float(s) for d, s in zip(retrieved, rng.random(40))}
    ours = evaluate_run(qrels, run)
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.1,3,5,10,100", "recall.1,5,10,100", "map"})
    theirs = evaluator.evaluate(run)
    for k in (1, 3, 5, 10, 100):
        assert ours[f"nDCG@{k}"] == pytest.approx(np.mean([v[f"ndcg_cut_{k}"] for v in theirs.values()]), abs=1e-6)
    for k in (1, 5, 10, 100):
        assert ours[f"Recall@{k}"] == pytest.approx(np.mean([v[f"recall_{k}"] for v in theirs.values()]), abs=1e-6)
    assert ours["MAP"] == pytest.approx(np.mean([v["map"] for v in theirs.values()]), abs=1e-6)
