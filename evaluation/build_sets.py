"""Build BEIR-format retrieval sets from local data (no BEIR corpus can be downloaded here).

    python -m evaluation.build_sets stsb --data-dir ../shared/data --out data/beir/stsb-retrieval
    python -m evaluation.build_sets snli --data-dir ../shared/data --out data/beir/snli-retrieval
    python -m evaluation.build_sets download --name scifact --out data/beir     # with the internet

stsb (InfoCSE §6.2, after DiffCSE): the corpus is every distinct sentence of the STS-B test set;
each pair scored 5.0 gives a query (its first sentence) whose one relevant document is its second.
A query is itself in the corpus under the same id: the evaluation drops a document whose id equals
the query's, as BEIR does (ignore_identical_ids), so a query never retrieves itself.

snli (ours, harder and larger): the corpus is every distinct hypothesis of SNLI dev and test; each
premise is a query whose entailed hypotheses are relevant with grade 2, its neutral ones grade 1,
and its contradictions judged 0. The graded nDCG rewards ranking entailment above neutral.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evaluation import beir
from evaluation.sts_data import normalize
from training.data import find_source_dir, read_snli, read_stsb

NLI_GRADE = {"entailment": 2, "neutral": 1, "contradiction": 0}


def _ids(sentences: list[str], prefix: str) -> dict[str, str]:
    return {s: f"{prefix}{i}" for i, s in enumerate(dict.fromkeys(sentences))}


def stsb_retrieval(data_dir: str | Path) -> beir.BeirSet:
    pairs = read_stsb(find_source_dir("stsb", data_dir), "test")
    pairs = [(normalize(p.sentence1), normalize(p.sentence2), p.label) for p in pairs]
    ids = _ids([s for a, b, _ in pairs for s in (a, b)], "s")
    queries, qrels = {}, {}
    for a, b, score in pairs:
        if score == 5.0 and a != b:
            queries[ids[a]] = a
            qrels.setdefault(ids[a], {})[ids[b]] = 1
    return beir.BeirSet({i: {"title": "", "text": s} for s, i in ids.items()}, queries, qrels)


def snli_retrieval(data_dir: str | Path, splits: tuple[str, ...] = ("dev", "test")) -> beir.BeirSet:
    snli = find_source_dir("snli", data_dir)
    triples = [(normalize(p), normalize(h), y) for split in splits for p, h, y in read_snli(snli, split)]
    triples = [t for t in triples if t[2] in NLI_GRADE]
    doc_ids = _ids([h for _, h, _ in triples], "h")
    query_ids = _ids([p for p, _, _ in triples], "p")
    qrels: dict[str, dict[str, int]] = {}
    for p, h, y in triples:
        judged = qrels.setdefault(query_ids[p], {})
        judged[doc_ids[h]] = max(judged.get(doc_ids[h], 0), NLI_GRADE[y])
    queries = {i: p for p, i in query_ids.items() if any(r > 0 for r in qrels[i].values())}
    return beir.BeirSet({i: {"title": "", "text": h} for h, i in doc_ids.items()}, queries,
                        {q: qrels[q] for q in queries})


BUILDERS = {"stsb": stsb_retrieval, "snli": snli_retrieval}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("set", choices=[*BUILDERS, "download"])
    parser.add_argument("--data-dir", type=Path, help="folder holding senteval/ (for stsb, snli)")
    parser.add_argument("--name", help="BEIR dataset name (download)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.set == "download":
        if not args.name:
            parser.error("download needs --name")
        print(f"downloaded to {beir.download(args.name, args.out)}")
        return 0
    if args.data_dir is None:
        parser.error(f"{args.set} needs --data-dir")
    data = BUILDERS[args.set](args.data_dir)
    beir.write(args.out, data)
    print(f"{args.out}: {len(data.corpus)} documents, {len(data.queries)} queries, "
          f"{sum(len(d) for d in data.qrels.values())} judgements")
    return 0


if __name__ == "__main__":
    sys.exit(main())
