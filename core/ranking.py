"""Exact in-process search over a BEIR set, and ranking metrics as BEIR computes them (pytrec_eval).

Shared by the harness (evaluation.retrieval) and the trainer's retrieval model selection
(training.selection), so both rank and score the same way.

qrels: {query_id: {doc_id: graded relevance int}}; run: {query_id: {doc_id: score}}.
- nDCG@k (trec_eval ndcg_cut): gain = the relevance grade (linear), discount 1/log2(rank + 1); the
  ideal DCG ranks *all* judged documents of the query by grade, retrieved or not.
- Recall@k (recall_k): relevant (grade ≥ 1) documents in the top k / all relevant documents.
- MAP (map): mean over the relevant documents of the precision at their rank, over the whole ranking
  (100 deep in our CLIs, so it equals BEIR's MAP@100); relevant documents never retrieved count 0.
- MRR@10: 1 / rank of the first relevant document within the top 10, else 0 (BEIR's MRR@10;
  trec_eval's recip_rank of the run cut to its top 10).
Rankings are ordered as trec_eval orders them: score descending, ties by document id descending.
Averages are over every query of the qrels, as BEIR averages over the queries pytrec_eval scores:
a query with no relevant document scores 0 on everything, and so does one missing from the run.
"""

from __future__ import annotations

import numpy as np

from core.beir import BeirSet
from core.sts import TextEncoder, normalize

NDCG_KS = (1, 3, 5, 10, 100)
RECALL_KS = (1, 5, 10, 100)
MRR_K = 10

Qrels = dict[str, dict[str, int]]
Run = dict[str, dict[str, float]]


def ranked(run_for_query: dict[str, float]) -> list[str]:
    """Document ids best first, as trec_eval sorts them (score descending, then id descending)."""
    by_id_desc = sorted(run_for_query, reverse=True)
    return sorted(by_id_desc, key=lambda d: -run_for_query[d])  # stable: ties keep id-descending order


def metric_names() -> list[str]:
    return [f"nDCG@{k}" for k in NDCG_KS] + [f"Recall@{k}" for k in RECALL_KS] + [f"MRR@{MRR_K}", "MAP"]


def per_query(qrels: Qrels, run: Run) -> dict[str, dict[str, float]]:
    """{query: {metric: value}} for every query of qrels (× 1, not %)."""
    import pytrec_eval

    qrels = {q: {d: int(r) for d, r in judged.items()} for q, judged in qrels.items()}
    run = {q: {d: float(s) for d, s in run.get(q, {}).items()} for q in qrels}
    measures = {"ndcg_cut." + ",".join(map(str, NDCG_KS)), "recall." + ",".join(map(str, RECALL_KS)), "map"}
    scores = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    top = {q: {d: docs[d] for d in ranked(docs)[:MRR_K]} for q, docs in run.items()}
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top)
    out = {}
    for q in qrels:
        s = scores.get(q, {})
        values = {f"nDCG@{k}": s.get(f"ndcg_cut_{k}", 0.0) for k in NDCG_KS}
        values.update({f"Recall@{k}": s.get(f"recall_{k}", 0.0) for k in RECALL_KS})
        values[f"MRR@{MRR_K}"] = rr.get(q, {}).get("recip_rank", 0.0)
        values["MAP"] = s.get("map", 0.0)
        out[q] = values
    return out


def evaluate_run(qrels: Qrels, run: Run) -> dict[str, float]:
    """Every metric averaged over the queries of qrels (× 1, not %)."""
    if not qrels:
        raise ValueError("qrels is empty: nothing to evaluate")
    values = per_query(qrels, run)
    return {name: float(np.mean([v[name] for v in values.values()])) for name in metric_names()}


def excluded_documents(data: BeirSet) -> dict[str, set[str]]:
    """For each query, the documents its ranking must not contain under the set's protocol."""
    by_text: dict[str, set[str]] = {}
    if data.protocol.ignore_identical_text:
        for did, doc in data.corpus.items():
            by_text.setdefault(normalize(BeirSet.document_text(doc)), set()).add(did)
    out = {}
    for qid, text in data.queries.items():
        drop = set(by_text.get(normalize(text), ()))
        if data.protocol.ignore_identical_ids and qid in data.corpus:
            drop.add(qid)
        out[qid] = drop
    return out


def keep_top(run: Run, excluded: dict[str, set[str]], depth: int) -> Run:
    """Drop the excluded documents, keep the best `depth` (trec_eval's order) of what is left."""
    out = {}
    for qid, docs in run.items():
        kept = {d: s for d, s in docs.items() if d not in excluded.get(qid, ())}
        out[qid] = {d: kept[d] for d in ranked(kept)[:depth]}
    return out


def search_in_process(embedder: TextEncoder, data: BeirSet, depth: int = 100) -> Run:
    import faiss

    excluded = excluded_documents(data)
    doc_ids = list(data.corpus)
    query_ids = list(data.queries)
    docs = np.ascontiguousarray(embedder.encode([BeirSet.document_text(data.corpus[d]) for d in doc_ids]),
                                dtype=np.float32)
    queries = np.ascontiguousarray(embedder.encode([data.queries[q] for q in query_ids]), dtype=np.float32)
    faiss.normalize_L2(docs)  # cosine, whatever the embedder returns
    faiss.normalize_L2(queries)
    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(docs)
    k = min(depth + max((len(e) for e in excluded.values()), default=0), len(doc_ids))
    scores, rows = index.search(queries, k)
    run = {q: {doc_ids[r]: float(s) for s, r in zip(srow, rrow) if r >= 0}
           for q, srow, rrow in zip(query_ids, scores, rows)}
    return keep_top(run, excluded, depth)
