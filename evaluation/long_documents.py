"""nDCG@10 on long documents whose relevant passage lies past the model's first 256 tokens: chunking against
truncation (issue 41, point 1).

    python -m evaluation.long_documents --model models/all-MiniLM-L6-v2 --data-dir /work/shared/data --size 128
    make eval-long-documents DATA=/work/shared/data

The set (built here, from --data-dir): each query is the first sentence of an STS-B test pair scored at least
--min-score (a paraphrase pair); its one relevant document is a long text of WordNet sentences
(corpus/wordnet-sentences.txt) with the pair's second sentence placed after --skip tokens of them (drawn
between --skip and 2 × --skip, counted with the model's tokenizer) and up to --tail tokens of them after it;
as many documents of WordNet sentences alone are distractors. No sentence is used twice.

Both arms fill a collection of the service's own index (LocalIndex) with the export's vectors (the ONNX backend
the service runs) and search it as POST /search does: truncation stores one vector per document, of the text
cut to the model's window (what the service did before chunking); chunking stores a vector per chunk, cut by
service/chunking.py with the model's tokenizer (the documents routes' defaults: the whole window, an overlap
of 32 tokens; --size and --overlap for more rows), and search answers each document at its best chunk.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from core import beir
from core.data import find_source_dir, read_stsb
from core.ranking import Run, evaluate_run
from core.sts import normalize
from evaluation.embedders import load_embedder
from service import chunking
from service.index import CollectionSpec, Document, LocalIndex, SearchParams
from service.tokenization import Tokenizer

BATCH = 64
WORDNET = Path("corpus") / "wordnet-sentences.txt"


def build(data_dir: Path, tokenizer: Tokenizer, queries: int, skip: int, tail: int, min_score: float,
          seed: int = 0) -> tuple[beir.BeirSet, dict[str, int]]:
    """The set, and where each relevant passage starts (its document's token count before it)."""
    rng = random.Random(seed)
    pairs = [(normalize(p.sentence1), normalize(p.sentence2)) for p in read_stsb(find_source_dir("stsb", data_dir),
                                                                               "test") if p.label >= min_score]
    pairs = list(dict.fromkeys((a, b) for a, b in pairs if a != b))
    rng.shuffle(pairs)
    pairs = pairs[:queries]
    if not (data_dir / WORDNET).is_file():
        raise SystemExit(f"error: {data_dir / WORDNET} not found: --data-dir must hold {WORDNET} (the shared data "
                         "folder does) beside senteval/")
    filler = iter((data_dir / WORDNET).read_text(encoding="utf-8").splitlines())

    def count(text: str) -> int:
        return len(tokenizer._full.encode(text, add_special_tokens=False).ids)

    def sentences(tokens: int) -> list[str]:
        out, n = [], 0
        while n < tokens:
            sentence = next(filler).strip()
            if sentence:
                sentence = sentence if sentence.endswith(".") else sentence + "."
                out.append(sentence)
                n += count(sentence)
        return out

    corpus, query_texts, qrels, offsets = {}, {}, {}, {}
    for i, (query, passage) in enumerate(pairs):
        before = sentences(rng.randint(skip, 2 * skip))
        after = sentences(rng.randint(0, tail)) if tail else []
        text = " ".join([*before, passage, *after])
        corpus[f"d{i}"] = {"title": "", "text": text}
        query_texts[f"q{i}"] = query
        qrels[f"q{i}"] = {f"d{i}": 1}
        offsets[f"d{i}"] = count(" ".join(before))
    for i in range(len(pairs)):  # distractors of the same lengths, no passage
        corpus[f"x{i}"] = {"title": "", "text": " ".join(sentences(rng.randint(skip, 2 * skip) + tail // 2))}
    protocol = beir.Protocol(note=f"long documents: the relevant passage after {skip}+ tokens (issue 41)")
    return beir.BeirSet(corpus, query_texts, qrels, protocol), offsets


def evaluate(embedder, tokenizer: Tokenizer, data: beir.BeirSet, options: chunking.ChunkOptions | None,
             k: int = 10) -> tuple[dict[str, float], int]:
    """The set's metrics with one vector per document (options None: truncation) or per chunk; and the rows."""
    index = LocalIndex(background=False)
    rows = 0
    try:
        ids = list(data.corpus)
        texts = [data.corpus[i]["text"] for i in ids]
        dimension = int(embedder.encode(["dimension"]).shape[1])
        index.create_collection(CollectionSpec("long", dimension))
        splitter = None if options is None else tokenizer.splitters.get(options)
        for start in range(0, len(ids), BATCH):
            documents = []
            for doc_id, text in zip(ids[start: start + BATCH], texts[start: start + BATCH]):
                spans = [(0, len(text))] if splitter is None else chunking.spans(splitter, text)
                documents.append(Document(doc_id, text, {}, spans if len(spans) > 1 else None))
            pieces = [d.text[a:b] for d in documents for a, b in d.spans()]
            rows += len(pieces)
            index.upsert("long", documents, embedder.encode(pieces))
        query_ids = list(data.queries)
        vectors = embedder.encode([data.queries[q] for q in query_ids])
        hits = index.search("long", vectors, SearchParams(k=k, with_text=False, with_metadata=False))
        run: Run = {q: {h.id: h.score for h in row} for q, row in zip(query_ids, hits, strict=True)}
        return evaluate_run(data.qrels, run), rows
    finally:
        index.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=Path, help="an export directory (manifest.json), e.g. "
                        "models/all-MiniLM-L6-v2")
    parser.add_argument("--data-dir", required=True, type=Path, help="folder holding senteval/ and corpus/")
    parser.add_argument("--queries", type=int, default=300, help="queries (and relevant documents)")
    parser.add_argument("--skip", type=int, default=256, help="the passage starts after this many tokens at least")
    parser.add_argument("--tail", type=int, default=128, help="tokens of text after the passage, at most")
    parser.add_argument("--min-score", type=float, default=4.0, help="STS-B pairs scored at least this")
    parser.add_argument("--size", type=int, action="append", default=[], help="also a chunk size in tokens "
                        "(repeatable)")
    parser.add_argument("--overlap", type=int, default=None, help="with --size: tokens chunks share")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    tokenizer = Tokenizer(args.model)
    embedder = load_embedder(model=args.model)
    data, offsets = build(args.data_dir, tokenizer, args.queries, args.skip, args.tail, args.min_score)
    lengths = [len(tokenizer._full.encode(d["text"], add_special_tokens=False).ids) for d in data.corpus.values()]
    print(f"{len(data.queries)} queries, {len(data.corpus)} documents of {min(lengths)}-{max(lengths)} tokens "
          f"(median {int(np.median(lengths))}); passages start at token {min(offsets.values())}-"
          f"{max(offsets.values())}; model {embedder.name}, window {tokenizer.max_seq_length}")
    limit = chunking.window(tokenizer.max_seq_length, tokenizer.special_tokens)
    arms: list[tuple[str, chunking.ChunkOptions | None]] = [("truncation", None),
                                                            ("chunking (defaults)", chunking.resolve(limit))]
    arms += [(f"chunking size {s}", chunking.resolve(limit, s, args.overlap)) for s in args.size]
    print("| arm | vectors | nDCG@10 | Recall@10 | MRR@10 | seconds |\n|---|---|---|---|---|---|")
    records = []
    for name, options in arms:
        start = time.perf_counter()
        metrics, rows = evaluate(embedder, tokenizer, data, options)
        seconds = time.perf_counter() - start
        print(f"| {name}{'' if options is None else f' ({options.size}/{options.overlap})'} | {rows} | "
              f"{100 * metrics['nDCG@10']:.2f} | {100 * metrics['Recall@10']:.2f} | {100 * metrics['MRR@10']:.2f} | "
              f"{seconds:.0f} |", flush=True)
        records.append({"arm": name, "size": None if options is None else options.size,
                        "overlap": None if options is None else options.overlap, "vectors": rows,
                        "metrics": metrics, "seconds": round(seconds, 1)})
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"model": embedder.name, "queries": len(data.queries),
                                        "documents": len(data.corpus), "skip": args.skip, "tail": args.tail,
                                        "arms": records}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
