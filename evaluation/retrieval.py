"""BEIR-style retrieval evaluation, in process or end to end through the service's FAISS index.

    python -m evaluation.retrieval --url http://localhost:8080 --data data/beir/stsb-retrieval
    python -m evaluation.retrieval --model models/all-MiniLM-L6-v2 --data data/beir/snli-retrieval

Documents are embedded as BEIR embeds them, (title + " " + text).strip(); queries as they are.
With --url the index is cleared (DELETE /index, unless --keep-index), the corpus is loaded through
POST /index/documents and every query ranked through POST /search: the service's own FAISS
inner-product search over normalised vectors. With --model the same exact search runs in process
(faiss IndexFlatIP in core.ranking, which the trainer's retrieval model selection runs too). Rankings are
--depth deep (100: nDCG@100, Recall@100, MAP over 100).

Identical query/document pairs: as BEIR's EvaluateRetrieval (ignore_identical_ids=True), a document
whose id equals the query's id is dropped from that query's ranking, so a query that is also a
document never counts itself. A set whose protocol.json says ignore_identical_text also drops the
documents whose text is the query's text (the in-domain STS-B set: see evaluation.build_sets).
Enough extra hits are fetched that every ranking still holds --depth documents after the drops.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from core import beir
from core.ranking import Run, evaluate_run, excluded_documents, keep_top, search_in_process
from evaluation.embedders import MAX_TEXT_CHARS, HttpClient, load_embedder


def index_corpus(client: HttpClient, data: beir.BeirSet, keep_index: bool = False) -> None:
    """Load the corpus into the service's index, in chunks it accepts."""
    if not keep_index:
        client.request("DELETE", "/index?confirm=true")
    documents = [{"id": d, "text": beir.BeirSet.document_text(doc)[:MAX_TEXT_CHARS],
                  "metadata": {"title": doc.get("title") or ""}} for d, doc in data.corpus.items()]
    for part in client.chunks(documents):
        client.request("POST", "/index/documents", {"documents": part})


def search_service(url: str, data: beir.BeirSet, depth: int = 100, keep_index: bool = False,
                   chunk: int = 128) -> Run:
    client = HttpClient(url, chunk)
    index_corpus(client, data, keep_index)
    excluded = excluded_documents(data)
    k = depth + max((len(e) for e in excluded.values()), default=0)
    query_ids = list(data.queries)
    run: Run = {}
    for part in client.chunks(query_ids):
        results = client.request("POST", "/search", {"query": [data.queries[q][:MAX_TEXT_CHARS] for q in part], "k": k})
        for qid, hits in zip(part, results["results"], strict=True):
            run[qid] = {h["id"]: h["score"] for h in hits}
    return keep_top(run, excluded, depth)


def format_table(label: str, dataset: str, metrics: dict[str, float]) -> str:
    names = list(metrics)
    return "\n".join([
        "| model | set | " + " | ".join(names) + " |",
        "|---" * (len(names) + 2) + "|",
        f"| {label} | {dataset} | " + " | ".join(f"{100 * metrics[n]:.2f}" for n in names) + " |",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--url", help="base URL of a running service (its index is cleared and replaced)")
    source.add_argument("--model", help="export directory or HF/sentence-transformers directory")
    parser.add_argument("--data", type=Path, required=True, help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    parser.add_argument("--split", default="test", help="qrels/<split>.tsv")
    parser.add_argument("--depth", type=int, default=100, help="documents ranked per query")
    parser.add_argument("--keep-index", action="store_true", help="with --url: add to the index, do not clear it")
    parser.add_argument("--out", type=Path, help="write the metrics as JSON here")
    parser.add_argument("--label", help="row name in reports (default: the model name, '+(service)' with --url)")
    args = parser.parse_args(argv)

    data = beir.load(args.data, args.split)
    start = time.perf_counter()
    if args.url:
        name = HttpClient(args.url).model_name()
        run = search_service(args.url, data, args.depth, args.keep_index)
    else:
        embedder = load_embedder(model=args.model)
        name, run = embedder.name, search_in_process(embedder, data, args.depth)
    seconds = time.perf_counter() - start
    metrics = evaluate_run(data.qrels, run)
    label = args.label or (f"{name} (service)" if args.url else name)
    print(format_table(label, args.data.name, metrics))
    print(f"({len(data.queries)} queries, {len(data.corpus)} documents, {seconds:.0f} s)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"model": name, "label": label, "source": args.url or args.model, "dataset": args.data.name,
                  "split": args.split, "queries": len(data.queries), "documents": len(data.corpus),
                  "depth": args.depth, "protocol": vars(data.protocol), "retrieval": metrics,
                  "seconds": round(seconds, 1)}
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
