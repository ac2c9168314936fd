"""A small in-domain set for the domain-adaptation recipe, from WordNet (no download needed).

    python -m evaluation.build_domain --lexfiles verb.contact --out data/domain/verb-contact

The "domain" is one or more WordNet lexicographer files (verb.contact: hitting, cutting, touching...).
Written under --out:
  text/definitions.txt   the user's own text: one document per line, each synset's headwords and
                         definition ("strike hit : deliver a sharp blow..."), never its usage examples;
  corpus.jsonl, queries.jsonl, qrels/dev.tsv, qrels/test.tsv   a BEIR folder: the documents are those
                         definitions (title = headwords); a query is a usage example of a synset
                         ("He struck the table with his fist") whose one relevant document is that
                         synset's definition. Telling apart the many senses of the same headword is the
                         task. dev and test hold different synsets (seeded shuffle), so selecting on dev
                         does not tune to the test senses.
  pairs/train.csv        the supervised twin, for a user with labelled pairs: SimCSE's NLI CSV
                         (sent0,sent1,hard_neg) with sent0 = a usage example, sent1 = its synset's
                         document (headwords and definition, as the corpus holds it) and hard_neg = the
                         document of another synset of the domain sharing a headword (another sense of
                         the same word); only synsets that are neither dev nor test queries, for the
                         example, the positive and the hard negative alike. `--train-data
                         nli-csv:<out>/pairs/train.csv` feeds CLSR and CoSENT.
"""

from __future__ import annotations

import argparse
import csv
import random
import re
import sys
from pathlib import Path

from core import beir

# WordNet's lexicographer file numbers (lexnames(5WN)); Debian's wordnet-base does not ship the file.
LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body "
    "noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location "
    "noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process "
    "noun.quantity noun.relation noun.shape noun.state noun.substance noun.time verb.body verb.change "
    "verb.cognition verb.communication verb.competition verb.consumption verb.contact verb.creation "
    "verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative verb.weather adj.ppl"
).split()
POS_FILES = {"noun": "data.noun", "verb": "data.verb", "adj": "data.adj", "adv": "data.adv"}
MIN_QUERY_WORDS = 4


def read_synsets(wordnet_dir: str | Path, lexfiles: list[str]) -> list[tuple[str, list[str], str, list[str]]]:
    """(synset id, headwords, definition, usage examples) for every synset of `lexfiles`."""
    unknown = set(lexfiles) - set(LEXNAMES)
    if unknown:
        raise ValueError(f"unknown lexicographer file(s) {sorted(unknown)}; e.g. verb.contact, noun.food")
    out = []
    for pos in sorted({name.split(".")[0] for name in lexfiles}):
        with open(Path(wordnet_dir) / POS_FILES[pos], encoding="utf-8") as f:
            for line in f:
                if line.startswith("  "):  # the licence header
                    continue
                head, _, gloss = line.partition(" | ")
                fields = head.split()
                if LEXNAMES[int(fields[1])] not in lexfiles:
                    continue
                words = [fields[4 + 2 * i].replace("_", " ") for i in range(int(fields[3], 16))]
                words = [re.sub(r"\(.*\)$", "", w) for w in words]  # adjective markers such as (a)
                examples = re.findall(r'"([^"]+)"', gloss)
                definition = gloss.split('"')[0].strip().rstrip(";").strip()
                if definition:
                    out.append((f"{pos}{fields[0]}", list(dict.fromkeys(words)), definition, examples))
    return out


def build(wordnet_dir: str | Path, lexfiles: list[str], n_dev: int, n_test: int, seed: int = 42):
    """(documents as text lines, BeirSet with every query, dev qrels, test qrels)."""
    synsets = read_synsets(wordnet_dir, lexfiles)
    corpus = {sid: {"title": " ".join(words), "text": definition} for sid, words, definition, _ in synsets}
    askable = [(sid, ex[0]) for sid, _, _, ex in synsets if ex and len(ex[0].split()) >= MIN_QUERY_WORDS]
    random.Random(seed).shuffle(askable)
    if len(askable) < n_dev + n_test:
        raise ValueError(f"{lexfiles}: only {len(askable)} synsets have a usage example; asked {n_dev}+{n_test}")
    dev, test = askable[:n_dev], askable[n_dev:n_dev + n_test]
    queries = {f"q{sid}": example for sid, example in dev + test}
    data = beir.BeirSet(corpus, queries, {}, beir.Protocol(note=f"WordNet {'+'.join(lexfiles)}: usage example "
                                                          "→ its synset's definition"))
    dev_qrels = {f"q{sid}": {sid: 1} for sid, _ in dev}
    test_qrels = {f"q{sid}": {sid: 1} for sid, _ in test}
    lines = [beir.BeirSet.document_text(doc) for doc in corpus.values()]
    return lines, data, dev_qrels, test_qrels


def supervised_pairs(synsets: list[tuple[str, list[str], str, list[str]]], held_out: set[str],
                     seed: int = 42) -> list[tuple[str, str, str]]:
    """(usage example, its synset's document, another sense's document) for every usage example of a
    synset outside `held_out` that shares a headword with another synset outside `held_out`."""
    kept = [s for s in synsets if s[0] not in held_out]
    doc = {sid: beir.BeirSet.document_text({"title": " ".join(words), "text": definition})
           for sid, words, definition, _ in kept}
    senses: dict[str, list[str]] = {}
    for sid, words, _, _ in kept:
        for w in words:
            senses.setdefault(w.lower(), []).append(sid)
    # WordNet repeats a few usage examples under several synsets: never train on a held-out one's
    asked = {ex for sid, _, _, examples in synsets if sid in held_out for ex in examples}
    rng = random.Random(seed)
    rows = []
    for sid, words, _, examples in kept:
        others = sorted({o for w in words for o in senses[w.lower()] if o != sid})
        if not others:
            continue
        for example in examples:
            if example not in asked:
                rows.append((example, doc[sid], doc[rng.choice(others)]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wordnet-dir", default="/usr/share/wordnet", help="holds data.noun, data.verb, ...")
    parser.add_argument("--lexfiles", nargs="+", default=["verb.contact"], help="the domain, e.g. verb.contact")
    parser.add_argument("--dev", type=int, default=150, help="queries in qrels/dev.tsv (model selection)")
    parser.add_argument("--test", type=int, default=500, help="queries in qrels/test.tsv (the report)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    lines, data, dev_qrels, test_qrels = build(args.wordnet_dir, args.lexfiles, args.dev, args.test, args.seed)
    held_out = {sid for qrels in (dev_qrels, test_qrels) for judged in qrels.values() for sid in judged}
    pairs = supervised_pairs(read_synsets(args.wordnet_dir, args.lexfiles), held_out, args.seed)
    for split, qrels in (("dev", dev_qrels), ("test", test_qrels)):
        data.qrels = qrels
        beir.write(args.out, data, split=split)
    (args.out / "text").mkdir(exist_ok=True)
    (args.out / "text" / "definitions.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (args.out / "pairs").mkdir(exist_ok=True)
    with open(args.out / "pairs" / "train.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sent0", "sent1", "hard_neg"])
        writer.writerows(pairs)
    print(f"{args.out}: {len(data.corpus)} documents (also text/definitions.txt), "
          f"{len(dev_qrels)} dev and {len(test_qrels)} test queries, {len(pairs)} labelled pairs (pairs/train.csv)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
