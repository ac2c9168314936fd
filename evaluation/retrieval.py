"""BEIR-style retrieval evaluation, in process or end to end through the service's FAISS index.

    python -m evaluation.retrieval --url http://localhost:8080 --data data/beir/stsb-retrieval
    python -m evaluation.retrieval --model models/all-MiniLM-L6-v2 --data data/beir/snli-retrieval

With --url the corpus is loaded through POST /index/documents (after DELETE /index unless
--keep-index) and ranked through POST /search. A document whose id equals the query's id is dropped
from that query's ranking (BEIR's ignore_identical_ids), so sets whose queries are also documents
never count a query retrieving itself. Rankings go `--depth` deep (default 100); MAP is over that depth.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from evaluation import beir
from evaluation.embedders import Embedder, HttpClient, load_embedder
from evaluation.metrics import evaluate_run

Run = dict[str, dict[str, float]]


def _drop_identical(run: Run, depth: int) -> Run:
    out = {}
    for qid, docs in run.items():
        kept = sorted(((d, s) for d, s in docs.items() if d != qid), key=lambda x: -x[1])[:depth]
        out[qid] = dict(kept)
    return out


def search_in_process(embedder: Embedder, data: beir.BeirSet, depth: int = 100) -> Run:
    import faiss

    doc_ids = list(data.corpus)
    docs = embedder.encode([beir.BeirSet.document_text(data.corpus[d]) for d in doc_ids])
    query_ids = list(data.queries)
    queries = embedder.encode([data.queries[q] for q in query_ids])
    faiss.normalize_L2(docs := np.ascontiguousarray(docs, dtype=np.float32))
    faiss.normalize_L2(queries := np.ascontiguousarray(queries, dtype=np.float32))
    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(docs)
    scores, rows = index.search(queries, min(depth + 1, len(doc_ids)))  # +1: room for a dropped self-match
    run = {q: {doc_ids[r]: float(s) for s, r in zip(srow, rrow) if r >= 0}
           for q, srow, rrow in zip(query_ids, scores, rows)}
    return _drop_identical(run, depth)


def search_service(url: str, data: beir.BeirSet, depth: int = 100, keep_index: bool = False,
                   chunk: int = 128) -> Run:
    client = HttpClient(url, chunk)
    if not keep_index:
        client.request("DELETE", "/index")
    documents = [{"id": d, "text": beir.BeirSet.document_text(doc), "metadata": {"title": doc.get("title", "")}}
                 for d, doc in data.corpus.items()]
    for part in client.chunks(documents):
        client.request("POST", "/index/documents", {"documents": part})
    query_ids = list(data.queries)
    run: Run = {}
    for part in client.chunks(query_ids):
        results = client.request("POST", "/search", {"query": [data.queries[q] for q in part], "k": depth + 1})
        for qid, hits in zip(part, results["results"]):
            run[qid] = {h["id"]: h["score"] for h in hits}
    return _drop_identical(run, depth)


def format_table(model: str, dataset: str, metrics: dict[str, float]) -> str:
    names = list(metrics)
    return "\n".join([
        "| model | set | " + " | ".join(names) + " |",
        "|---" * (len(names) + 2) + "|",
        f"| {model} | {dataset} | " + " | ".join(f"{100 * metrics[n]:.2f}" for n in names) + " |",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--url", help="base URL of a running service (its index is replaced)")
    source.add_argument("--model", help="export directory or HF/sentence-transformers directory")
    parser.add_argument("--data", type=Path, required=True, help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--keep-index", action="store_true", help="with --url: add to the index, do not clear it")
    parser.add_argument("--out", type=Path, help="write the metrics as JSON here")
    args = parser.parse_args(argv)

    data = beir.load(args.data, args.split)
    if args.url:
        name = HttpClient(args.url).request("GET", "/info")["manifest"]["name"]
        run = search_service(args.url, data, args.depth, args.keep_index)
    else:
        embedder = load_embedder(model=args.model)
        name, run = embedder.name, search_in_process(embedder, data, args.depth)
    metrics = evaluate_run(data.qrels, run)
    print(format_table(name, args.data.name, metrics))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"model": name, "source": args.url or args.model, "dataset": args.data.name,
                                        "queries": len(data.queries), "documents": len(data.corpus),
                                        "retrieval": metrics}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
