"""nDCG@10 of the index's three search modes (dense, lexical, hybrid) on our retrieval sets (issue 41).

    python -m evaluation.hybrid --model models/all-MiniLM-L6-v2 --data-dir /work/shared/data
    python -m evaluation.hybrid --model models/all-MiniLM-L6-v2 --sets domain --beir data/beir/scifact

Each set becomes one collection of the service's own index (LocalIndex, in memory, with its lexical
index: service/index/lexical.py), filled with the export's vectors (the ONNX backend the service runs)
and searched per query in each mode, as POST /collections/{name}/search with "mode" does. Sets:
stsb and snli (evaluation.build_sets, from --data-dir), domain (evaluation.build_domain: WordNet's
verb.contact, test queries), and any BEIR folder given with --beir. The sets' protocols hold: a query
never counts itself (evaluation.retrieval). Hybrid fuses the two rankings by reciprocal rank, with
--rrf-k, --dense-weight, --lexical-weight and --candidates as the search's `fusion` takes them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from core import beir
from core.ranking import Run, evaluate_run, excluded_documents, keep_top
from evaluation.build_domain import build as build_domain
from evaluation.build_sets import snli_retrieval, stsb_retrieval
from evaluation.embedders import MAX_TEXT_CHARS, load_embedder
from service.index import CollectionSpec, Document, LocalIndex, SearchParams

MODES = ("dense", "lexical", "hybrid")
DEPTH = 100  # rankings this deep: nDCG@10 is the headline, Recall@100 beside it
BATCH = 256


def load_sets(names: list[str], data_dir: Path | None, wordnet_dir: Path, beir_dirs: list[Path]):
    """(name, BeirSet) of each set asked for, built in memory."""
    for name in names:
        if name in ("stsb", "snli"):
            if data_dir is None:
                raise SystemExit(f"error: {name} needs --data-dir (the folder holding senteval/)")
            yield name, (stsb_retrieval if name == "stsb" else snli_retrieval)(data_dir)
        elif name == "domain":
            _, data, _, test_qrels = build_domain(wordnet_dir, ["verb.contact"], 150, 500)
            data.qrels = test_qrels
            data.queries = {q: data.queries[q] for q in test_qrels}
            yield "domain (verb.contact)", data
        else:
            raise SystemExit(f"error: unknown set {name!r}: stsb, snli, domain (or --beir DIR)")
    for folder in beir_dirs:
        yield folder.name, beir.load(folder, "test")


def evaluate(embedder, data: beir.BeirSet, fusion: dict) -> dict[str, dict[str, float]]:
    """The metrics of each mode on `data`, from one lexical collection of the service's index."""
    index = LocalIndex(background=False)
    try:
        doc_ids = list(data.corpus)
        texts = [beir.BeirSet.document_text(data.corpus[d])[:MAX_TEXT_CHARS] for d in doc_ids]
        index.create_collection(CollectionSpec("eval", embedder_dimension(embedder), lexical=True))
        for start in range(0, len(doc_ids), BATCH):
            part = slice(start, start + BATCH)
            documents = [Document(i, t) for i, t in zip(doc_ids[part], texts[part])]
            index.upsert("eval", documents, embedder.encode(texts[part]))
        excluded = excluded_documents(data)
        k = DEPTH + max((len(e) for e in excluded.values()), default=0)
        query_ids = list(data.queries)
        query_texts = [data.queries[q][:MAX_TEXT_CHARS] for q in query_ids]
        vectors = np.concatenate([embedder.encode(query_texts[s: s + BATCH])
                                  for s in range(0, len(query_texts), BATCH)])
        out = {}
        for mode in MODES:
            run: Run = {}
            for start in range(0, len(query_ids), BATCH):
                part = slice(start, start + BATCH)
                params = SearchParams(k=k, mode=mode, texts=None if mode == "dense" else query_texts[part],
                                      with_text=False, with_metadata=False, **(fusion if mode == "hybrid" else {}))
                hits = index.search("eval", None if mode == "lexical" else vectors[part], params)
                for qid, row in zip(query_ids[part], hits, strict=True):
                    run[qid] = {h.id: h.score for h in row}
            out[mode] = evaluate_run(data.qrels, keep_top(run, excluded, DEPTH))
        return out
    finally:
        index.close()


def embedder_dimension(embedder) -> int:
    return int(embedder.encode(["dimension"]).shape[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an export directory (manifest.json), e.g. "
                        "models/all-MiniLM-L6-v2")
    parser.add_argument("--data-dir", type=Path, help="folder holding senteval/ (stsb, snli)")
    parser.add_argument("--wordnet-dir", type=Path, default=Path("/usr/share/wordnet"), help="for the domain set")
    parser.add_argument("--sets", nargs="*", default=["stsb", "snli", "domain"], help="stsb snli domain")
    parser.add_argument("--beir", type=Path, action="append", default=[], help="a BEIR folder (its test qrels)")
    parser.add_argument("--rrf-k", type=int, default=60)
    parser.add_argument("--dense-weight", type=float, default=1.0)
    parser.add_argument("--lexical-weight", type=float, default=1.0)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--out", type=Path, help="write every set's metrics per mode as JSON here")
    args = parser.parse_args(argv)

    embedder = load_embedder(model=args.model)
    fusion = {"rrf_k": args.rrf_k, "dense_weight": args.dense_weight, "lexical_weight": args.lexical_weight,
              "candidates": args.candidates}
    print("| set | documents | queries | " + " | ".join(f"{m} nDCG@10" for m in MODES) + " | "
          + " | ".join(f"{m} R@100" for m in MODES) + " |")
    print("|---" * (3 + 2 * len(MODES)) + "|")
    records = []
    for name, data in load_sets(args.sets, args.data_dir, args.wordnet_dir, args.beir):
        start = time.perf_counter()
        metrics = evaluate(embedder, data, fusion)
        print(f"| {name} | {len(data.corpus)} | {len(data.queries)} | "
              + " | ".join(f"{100 * metrics[m]['nDCG@10']:.2f}" for m in MODES) + " | "
              + " | ".join(f"{100 * metrics[m]['Recall@100']:.2f}" for m in MODES) + " |", flush=True)
        records.append({"set": name, "documents": len(data.corpus), "queries": len(data.queries),
                        "seconds": round(time.perf_counter() - start, 1), "metrics": metrics})
    print(f"(model {embedder.name}; hybrid: reciprocal rank fusion, k={args.rrf_k}, weights dense "
          f"{args.dense_weight} / lexical {args.lexical_weight}, {args.candidates} candidates of each)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"model": embedder.name, "fusion": fusion, "sets": records}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
