"""Build BEIR-format retrieval sets from local data (no BEIR corpus can be downloaded here).

    python -m evaluation.build_sets stsb --data-dir data/datasets --out data/beir/stsb-retrieval
    python -m evaluation.build_sets snli --data-dir data/datasets --out data/beir/snli-retrieval
    python -m evaluation.build_sets download --name scifact --out data/beir     # with the internet

stsb: InfoCSE §6.2 (after DiffCSE), Table 11's in-domain retrieval. The corpus is the STS-B test
set's sentences; each of its 97 pairs scored 5.0 gives one query, its first sentence, whose one
relevant document is its second sentence. Choices where the paper is silent:
  - the paper counts 2,758 sentences (2 × 1,379 pairs); 207 of them are word-for-word repeats, and
    a repeated sentence is one document here (2,551), since its copies would only add exact ties;
  - a query's own sentence is in the corpus: it is dropped from the query's ranking by text (the
    folder's protocol.json says ignore_identical_text), not by id, because 21 of the 97 queries
    share their sentence with another query (86 distinct), and each keeps its own id and its own
    partner, as the paper's 97 queries do.
Recall@1/5/10 × 100 are the paper's R@1/5/10.

snli (ours, harder and larger): the corpus is every distinct hypothesis of SNLI dev and test
(19,110); each premise is a query (6,613) whose entailed hypotheses are relevant with grade 2, its
neutral ones grade 1, its contradictions judged 0. The graded nDCG rewards ranking entailment above
neutral; the contradictions, written about the same scene, are hard negatives. (CLSR's preset trains
on SNLI dev+test: do not compare a CLSR model on this set.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core import beir
from core.data import GET_DATA, DataNotFound, find_source_dir, read_snli, read_stsb
from core.sts import normalize

NLI_GRADE = {"entailment": 2, "neutral": 1, "contradiction": 0}


def _ids(sentences: list[str], prefix: str) -> dict[str, str]:
    """One id per distinct sentence, numbered in order of first appearance."""
    return {s: f"{prefix}{i}" for i, s in enumerate(dict.fromkeys(sentences))}


def stsb_retrieval(data_dir: str | Path, gold: float = 5.0) -> beir.BeirSet:
    pairs = read_stsb(find_source_dir("stsb", data_dir), "test")
    pairs = [(normalize(p.sentence1), normalize(p.sentence2), p.label) for p in pairs]
    doc_ids = _ids([s for a, b, _ in pairs for s in (a, b)], "s")
    queries, qrels = {}, {}
    for row, (a, b, score) in enumerate(pairs):
        if score == gold and a != b:  # (no 5.0 pair of STS-B test is two identical sentences)
            queries[f"q{row}"] = a  # the pair's row in sts-test.csv
            qrels[f"q{row}"] = {doc_ids[b]: 1}
    protocol = beir.Protocol(
        ignore_identical_ids=True,
        ignore_identical_text=True,
        note="InfoCSE §6.2 in-domain retrieval: a query never retrieves its own sentence; R@k = Recall@k",
    )
    return beir.BeirSet({i: {"title": "", "text": s} for s, i in doc_ids.items()}, queries, qrels, protocol)


def snli_retrieval(data_dir: str | Path, splits: tuple[str, ...] = ("dev", "test")) -> beir.BeirSet:
    snli = find_source_dir("snli", data_dir)
    triples = [(normalize(p), normalize(h), y) for split in splits for p, h, y in read_snli(snli, split)]
    doc_ids = _ids([h for _, h, _ in triples], "h")
    query_ids = _ids([p for p, _, _ in triples], "p")
    qrels: dict[str, dict[str, int]] = {}
    for p, h, y in triples:
        judged = qrels.setdefault(query_ids[p], {})
        judged[doc_ids[h]] = max(judged.get(doc_ids[h], 0), NLI_GRADE[y])
    # a premise with contradictions only has nothing to find
    queries = {i: p for p, i in query_ids.items() if any(r > 0 for r in qrels[i].values())}
    protocol = beir.Protocol(note="premise → its hypotheses: entailment 2, neutral 1, contradiction 0")
    return beir.BeirSet({i: {"title": "", "text": h} for h, i in doc_ids.items()}, queries,
                        {q: qrels[q] for q in queries}, protocol)


BUILDERS = {"stsb": stsb_retrieval, "snli": snli_retrieval}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("set", help="stsb | snli (or stsb-retrieval | snli-retrieval) | download")
    parser.add_argument("--data-dir", type=Path, help="folder holding senteval/ (for stsb, snli)")
    parser.add_argument("--name", help="BEIR dataset name (download), e.g. scifact")
    parser.add_argument("--out", type=Path, required=True, help="the BEIR folder to write (download: its parent)")
    args = parser.parse_args(argv)
    name = args.set.removesuffix("-retrieval")
    if name == "download":
        if not args.name:
            parser.error("download needs --name")
        print(f"downloaded to {beir.download(args.name, args.out)}")
        return 0
    if name not in BUILDERS:
        parser.error(f"unknown set {args.set!r}; choose from {', '.join(BUILDERS)}, download")
    if args.data_dir is None:
        parser.error(f"{name} needs --data-dir (DATA= in make); {GET_DATA}")
    try:
        data = BUILDERS[name](args.data_dir)
    except DataNotFound as e:  # says which command gets the data
        raise SystemExit(f"error: {e}") from None
    beir.write(args.out, data)
    print(f"{args.out}: {len(data.corpus)} documents, {len(data.queries)} queries, "
          f"{sum(len(d) for d in data.qrels.values())} judgements")
    return 0


if __name__ == "__main__":
    sys.exit(main())
