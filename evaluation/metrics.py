"""Ranking metrics with trec_eval's definitions, as pytrec_eval (and so BEIR) computes them.

qrels: {query_id: {doc_id: relevance int}}; run: {query_id: {doc_id: score}}.
- nDCG@k: gain = relevance (linear, trec_eval's ndcg_cut), discount 1/log2(rank + 1); the ideal
  DCG ranks *all* judged documents of the query by relevance, retrieved or not.
- Recall@k: relevant (relevance > 0) documents in the top k / all relevant documents.
- MRR@10: 1 / rank of the first relevant document within the top 10, else 0 (BEIR's mrr@10).
- MAP: mean over relevant documents of the precision at their rank, over the whole run depth;
  relevant documents never retrieved count as precision 0 (divided by all relevant).
Ranking orders by score, ties broken by document id descending, as trec_eval does. Queries without
any relevant document in qrels are left out of the averages, as pytrec_eval leaves them out.
"""

from __future__ import annotations

import math

import numpy as np

NDCG_KS = (1, 3, 5, 10, 100)
RECALL_KS = (1, 5, 10, 100)


def ranked(run_for_query: dict[str, float]) -> list[str]:
    return [d for d, _ in sorted(run_for_query.items(), key=lambda x: (-x[1], _neg_key(x[0])))]


def _neg_key(doc_id: str):
    # trec_eval breaks score ties by docno in descending order
    return tuple(-ord(c) for c in doc_id)


def ndcg_at_k(ranking: list[str], judged: dict[str, int], k: int) -> float:
    dcg = sum(judged.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:k]))
    ideal = sorted((r for r in judged.values() if r > 0), reverse=True)[:k]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranking: list[str], judged: dict[str, int], k: int) -> float:
    relevant = {d for d, r in judged.items() if r > 0}
    return len(relevant.intersection(ranking[:k])) / len(relevant)


def mrr_at_k(ranking: list[str], judged: dict[str, int], k: int = 10) -> float:
    for i, d in enumerate(ranking[:k]):
        if judged.get(d, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def average_precision(ranking: list[str], judged: dict[str, int]) -> float:
    relevant = {d for d, r in judged.items() if r > 0}
    hits, total = 0, 0.0
    for i, d in enumerate(ranking):
        if d in relevant:
            hits += 1
            total += hits / (i + 1)
    return total / len(relevant)


def evaluate_run(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]]) -> dict[str, float]:
    """Every metric, averaged over the queries of qrels that have a relevant document (× 1, not %)."""
    per_metric: dict[str, list[float]] = {}
    for qid, judged in qrels.items():
        if not any(r > 0 for r in judged.values()):
            continue
        ranking = ranked(run.get(qid, {}))
        values = {f"nDCG@{k}": ndcg_at_k(ranking, judged, k) for k in NDCG_KS}
        values.update({f"Recall@{k}": recall_at_k(ranking, judged, k) for k in RECALL_KS})
        values["MRR@10"] = mrr_at_k(ranking, judged, 10)
        values["MAP"] = average_precision(ranking, judged)
        for name, v in values.items():
            per_metric.setdefault(name, []).append(v)
    if not per_metric:
        raise ValueError("no query in qrels has a relevant document")
    return {name: float(np.mean(v)) for name, v in per_metric.items()}
