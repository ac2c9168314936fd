"""Training examples: the three kinds of data the objectives consume, and their readers.

Readers take local paths (SentEval / STS-B / SICK layouts, the SNLI / MultiNLI jsonl, the AllNLI tsv,
the SimCSE NLI CSV, PAWS / MRPC / QQP, one-sentence-per-line text); `../shared/data/` is one such
source, never a hard-coded location.
"""

from __future__ import annotations

import csv
import gzip
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PairExample:
    """A positive pair, with an optional hard negative (SimCSE's NLI CSV: sent0, sent1, hard_neg)."""

    anchor: str
    positive: str
    negative: str | None = None


@dataclass(frozen=True)
class ScoredPair:
    """Two sentences and a label: a similarity score, a 0/1 label, or an ordinal NLI label."""

    sentence1: str
    sentence2: str
    label: float


#: What every message about a missing dataset ends with: the command that gets it (core/datasets.py).
GET_DATA = ("get the evaluation and training sets with `make data` (a download, checked by sha256) or, offline, "
            "`make data FROM=<folder holding them>`, into DATA (data/datasets; pass that folder as --data-dir)")
#: The named sources `make data` fetches; other sources (PAWS, MRPC, QQP, MultiNLI) are yours to get.
FETCHED_SOURCES = ("stsb", "sick", "snli")


class DataNotFound(FileNotFoundError):
    """A dataset a command needs is not where it looked; the message says which command gets it.
    Command-line tools print it and exit 1 instead of a traceback."""


# What Objective.data_kind names, and the example type each kind yields.
DATA_KINDS = {"unlabeled": str, "pairs": PairExample, "scored": ScoredPair}


# ---------------------------------------------------------------------------------------------
# Readers. Each takes a local path and returns a list of one example type.

#: NLI labels as CoSENT's ordinal similarity (§IV-D, Table II: "0, 1, 2").
NLI_LABELS = {"contradiction": 0, "neutral": 1, "entailment": 2}
STSB_FILES = {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test.csv"}
SICK_FILES = {
    "train": "SICK_train.txt",
    "trial": "SICK_trial.txt",
    "dev": "SICK_trial.txt",
    "test": "SICK_test_annotated.txt",
}
# SNLI + MultiNLI as CoSENT Table II counts them (942,069 / 19,657 / 19,656 labelled pairs): MultiNLI
# has no public test labels, so dev = SNLI dev + dev-matched and test = SNLI test + dev-mismatched.
NLI_JSONL = {
    "train": ("snli_1.0/snli_1.0_train.jsonl", "multinli_1.0/multinli_1.0_train.jsonl"),
    "dev": ("snli_1.0/snli_1.0_dev.jsonl", "multinli_1.0/multinli_1.0_dev_matched.jsonl"),
    "test": ("snli_1.0/snli_1.0_test.jsonl", "multinli_1.0/multinli_1.0_dev_mismatched.jsonl"),
}
ALLNLI_TSV = ("AllNLI.tsv.gz", "AllNLI.tsv")
PAWS_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}  # PAWS-Wiki "final"
MRPC_FILES = {"train": "msr_paraphrase_train.txt", "test": "msr_paraphrase_test.txt"}
QQP_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}  # GLUE's; its test has no labels


def _take(items: list, limit: int | None) -> list:
    return items if limit is None else items[:limit]


def read_text(path: str | Path, limit: int | None = None) -> list[str]:
    """One sentence per line (stripped); blank lines skipped; the first `limit` sentences.

    A folder: every *.txt file under it, in sorted path order (a user's own text, as it lies).
    """
    path = Path(path)
    if not path.exists():
        raise DataNotFound(f"{path}: no such file or folder; for the sentence corpora (corpus/wordnet-sentences.txt, "
                           f"wiki1m_for_simcse.txt), {GET_DATA}")
    files = sorted(p for p in path.rglob("*.txt") if p.is_file()) if path.is_dir() else [path]
    if not files:
        raise DataNotFound(f"no *.txt files under {path}; for the sentence corpora, {GET_DATA}")
    out: list[str] = []
    for file in files:
        with open(file, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    out.append(line)
                    if limit is not None and len(out) >= limit:
                        return out
    return out


def read_snli(snli_dir: str | Path, split: str = "train") -> list[tuple[str, str, str]]:
    """(premise, hypothesis, label) from SentEval's SNLI layout: s1.<split>, s2.<split>, labels.<split>.

    Lines end in a space in that layout, so every field is stripped. Labels other than the three NLI
    ones (SNLI's "-": no gold label) are dropped.
    """
    d = Path(snli_dir)
    cols = [(d / f"{name}.{split}").read_text(encoding="utf-8").splitlines() for name in ("s1", "s2", "labels")]
    if not len(cols[0]) == len(cols[1]) == len(cols[2]):
        raise ValueError(f"{d}: s1/s2/labels.{split} have {[len(c) for c in cols]} lines")
    rows = []
    for s1, s2, label in zip(*cols, strict=True):
        label = label.strip().lower()
        if label in NLI_LABELS:
            rows.append((s1.strip(), s2.strip(), label))
    return rows


def nli_pairs(triples: list[tuple[str, str, str]]) -> list[PairExample]:
    """Entailment pairs, each with a contradiction hypothesis of the same premise as hard negative
    when the premise has one (the k-th entailment of a premise takes its k-th contradiction, cycling),
    as SimCSE's supervised NLI set is built."""
    contradictions: dict[str, list[str]] = defaultdict(list)
    for premise, hypothesis, label in triples:
        if label == "contradiction":
            contradictions[premise].append(hypothesis)
    seen: dict[str, int] = defaultdict(int)
    out = []
    for premise, hypothesis, label in triples:
        if label != "entailment":
            continue
        negs = contradictions.get(premise)
        negative = negs[seen[premise] % len(negs)] if negs else None
        seen[premise] += 1
        out.append(PairExample(premise, hypothesis, negative))
    return out


def _read_nli_csv(path: str | Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and not {"sent0", "sent1"} <= set(rows[0]):
        raise ValueError(f"{path}: expected a header with sent0,sent1[,hard_neg], got {list(rows[0])}")
    return rows


def read_nli_csv_pairs(path: str | Path, limit: int | None = None) -> list[PairExample]:
    """SimCSE's NLI CSV (quoted, header sent0,sent1,hard_neg; hard_neg optional or empty)."""
    rows = _read_nli_csv(path)
    return _take([PairExample(r["sent0"], r["sent1"], r.get("hard_neg") or None) for r in rows], limit)


def read_nli_csv_scored(path: str | Path, limit: int | None = None) -> list[ScoredPair]:
    """SimCSE's NLI CSV as ordinal pairs: (sent0, sent1) entailment 2, (sent0, hard_neg) contradiction 0."""
    out = []
    for r in _read_nli_csv(path):
        out.append(ScoredPair(r["sent0"], r["sent1"], float(NLI_LABELS["entailment"])))
        if r.get("hard_neg"):
            out.append(ScoredPair(r["sent0"], r["hard_neg"], float(NLI_LABELS["contradiction"])))
    return _take(out, limit)


def _open_text(path: str | Path):
    # utf-8-sig: MRPC's files start with a byte-order mark
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def read_nli_jsonl(path: str | Path) -> list[tuple[str, str, str]]:
    """(premise, hypothesis, label) from SNLI's or MultiNLI's jsonl (gold_label, sentence1, sentence2,
    plus parses and annotator labels, ignored); `.gz` is read as is. Gold label "-" (no consensus)
    is dropped."""
    rows = []
    with _open_text(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                label = r["gold_label"].strip().lower()
                pair = (r["sentence1"].strip(), r["sentence2"].strip())
            except (json.JSONDecodeError, KeyError, AttributeError) as e:
                raise ValueError(f"{path}:{n}: not an NLI jsonl record with gold_label/sentence1/sentence2") from e
            if label in NLI_LABELS:
                rows.append((*pair, label))
    return rows


def _read_tsv(path: str | Path, columns: tuple[str, ...]) -> list[list[str]]:
    """The `columns` (by header name) of every row of a headed tab-separated file, read with
    csv.QUOTE_NONE as GLUE's and PAWS's own loaders do: sentences hold unbalanced quotes."""
    with _open_text(path) as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = [h.strip() for h in next(reader, [])]
        if not set(columns) <= set(header):
            raise ValueError(f"{path}: expected columns {list(columns)}, got header {header}")
        idx = [header.index(c) for c in columns]
        out = []
        for n, row in enumerate(reader, 2):
            if not row or row == [""]:
                continue
            if len(row) < len(header):
                raise ValueError(f"{path}:{n}: expected {len(header)} tab-separated fields, got {len(row)}")
            out.append([row[i].strip() for i in idx])
    return out


def read_allnli_tsv(path: str | Path, splits: tuple[str, ...] = ("train",)) -> list[tuple[str, str, str]]:
    """(premise, hypothesis, label) of `splits` from sentence-transformers' AllNLI.tsv(.gz)
    (split, dataset, filename, sentence1, sentence2, label), split after split, each in file order."""
    rows = _read_tsv(path, ("split", "sentence1", "sentence2", "label"))
    return [(p, h, y.lower()) for s in splits for split, p, h, y in rows if split == s and y.lower() in NLI_LABELS]


def find_nli_triples(data_dir: str | Path, splits: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """SNLI + MultiNLI (SBERT's "AllNLI", CLSR §4.1's and CoSENT's NLI) under `data_dir` or its nli/:
    AllNLI.tsv(.gz) if there, else the two corpora's jsonl in their archives' folders (snli_1.0/,
    multinli_1.0/) or side by side."""
    unknown = set(splits) - set(NLI_JSONL)
    if unknown:
        raise ValueError(f"unknown NLI split(s) {sorted(unknown)}; choose from {', '.join(NLI_JSONL)}")
    roots = [Path(data_dir), Path(data_dir) / "nli", Path(data_dir) / "NLI"]
    for root in roots:
        for name in ALLNLI_TSV:
            if (root / name).is_file():
                return read_allnli_tsv(root / name, splits)
    triples = []
    for split in splits:
        for rel in NLI_JSONL[split]:
            found = [p for root in roots for p in (root / rel, root / Path(rel).name) if p.is_file()]
            if not found:
                raise FileNotFoundError(f"no {Path(rel).name} (nor {' / '.join(ALLNLI_TSV)}) under {data_dir}")
            triples += read_nli_jsonl(found[0])
    return triples


def read_binary_pairs(path: str | Path, columns: tuple[str, str, str]) -> list[ScoredPair]:
    """(sentence1, sentence2, 0/1 label) from the named columns of a headed tsv."""
    return [ScoredPair(a, b, float(y)) for a, b, y in _read_tsv(path, columns)]


def read_paws(paws_dir: str | Path, split: str = "train") -> list[ScoredPair]:
    """PAWS-Wiki (final) <split>.tsv: id, sentence1, sentence2, label (1 = paraphrase)."""
    return read_binary_pairs(Path(paws_dir) / PAWS_FILES[split], ("sentence1", "sentence2", "label"))


def read_mrpc(mrpc_dir: str | Path, split: str = "train") -> list[ScoredPair]:
    """MRPC msr_paraphrase_<split>.txt: Quality, #1 ID, #2 ID, #1 String, #2 String (Quality 1 = paraphrase)."""
    return read_binary_pairs(Path(mrpc_dir) / MRPC_FILES[split], ("#1 String", "#2 String", "Quality"))


def read_qqp(qqp_dir: str | Path, split: str = "train") -> list[ScoredPair]:
    """QQP <split>.tsv (GLUE): id, qid1, qid2, question1, question2, is_duplicate."""
    return read_binary_pairs(Path(qqp_dir) / QQP_FILES[split], ("question1", "question2", "is_duplicate"))


_BINARY_READERS = {"paws": (read_paws, PAWS_FILES), "mrpc": (read_mrpc, MRPC_FILES), "qqp": (read_qqp, QQP_FILES)}


def read_stsb(stsb_dir: str | Path, split: str = "train", limit: int | None = None) -> list[ScoredPair]:
    """STS-B sts-<split>.csv: tab separated genre, file, year, id, score, sentence1, sentence2[, ...].

    Read with csv.QUOTE_NONE: sentences contain unbalanced quotes, and some distributions append
    extra columns (sources) after sentence2, which are ignored. Scores are 0–5.
    """
    path = Path(stsb_dir) / STSB_FILES[split]
    out = []
    with open(path, encoding="utf-8", newline="") as f:
        for n, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
            if not row or row == [""]:
                continue
            if len(row) < 7:
                raise ValueError(f"{path}:{n}: expected at least 7 tab-separated fields, got {len(row)}")
            out.append(ScoredPair(row[5].strip(), row[6].strip(), float(row[4])))
    return _take(out, limit)


def read_stsb_pairs(
    stsb_dir: str | Path, splits: tuple[str, ...] = ("train",), threshold: float = 4.0, limit: int | None = None
) -> list[PairExample]:
    """CLSR's STS positives (§4.1): STS-B pairs scored strictly above `threshold`.

    The paper filters all 8,628 pairs (train + dev + test); the default uses train only so the
    evaluation splits stay unseen. Pass splits=("train", "dev", "test") for the paper's set.
    """
    out = [PairExample(p.sentence1, p.sentence2) for s in splits for p in read_stsb(stsb_dir, s) if p.label > threshold]
    return _take(out, limit)


def read_sick(
    sick_dir: str | Path, split: str = "train", label: str = "relatedness", limit: int | None = None
) -> list[ScoredPair]:
    """SICK_{train,trial,test_annotated}.txt (tab separated, header pair_ID, sentence_A, sentence_B,
    relatedness_score, entailment_judgment). label="relatedness": the 1–5 score; label="entailment":
    CONTRADICTION 0 < NEUTRAL 1 < ENTAILMENT 2 (CoSENT Table II lists both)."""
    if label not in ("relatedness", "entailment"):
        raise ValueError(f"label must be 'relatedness' or 'entailment', not {label!r}")
    path = Path(sick_dir) / SICK_FILES[split]
    out = []
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            y = (
                float(row["relatedness_score"])
                if label == "relatedness"
                else float(NLI_LABELS[row["entailment_judgment"].strip().lower()])
            )
            out.append(ScoredPair(row["sentence_A"].strip(), row["sentence_B"].strip(), y))
    return _take(out, limit)


# Where each named source lives under a data folder: the shared-data layout (senteval/...),
# SentEval's own (data/downstream/...), or the folder itself; the first that has the marker wins.
_LAYOUTS = {
    "stsb": (
        ["senteval/STS/STSBenchmark", "downstream/STS/STSBenchmark", "STS/STSBenchmark", "STSBenchmark", "."],
        "sts-dev.csv",
    ),
    "sick": (["senteval/SICK", "downstream/SICK", "SICK", "."], "SICK_trial.txt"),
    "snli": (["senteval/SNLI", "downstream/SNLI", "SNLI", "."], None),
    "paws": (["paws/final", "PAWS/final", "paws_wiki/final", "final", "paws", "PAWS", "."], "dev.tsv"),
    "mrpc": (["MRPC", "mrpc", "glue_data/MRPC", "."], "msr_paraphrase_train.txt"),
    "qqp": (["QQP", "qqp", "glue_data/QQP", "."], "dev.tsv"),
}


def find_source_dir(name: str, data_dir: str | Path, marker: str | None = None) -> Path:
    """The folder of a named source (stsb, sick, snli, paws, mrpc, qqp) under `data_dir`; the first
    candidate that holds `marker` (default: the source's usual file)."""
    candidates, default_marker = _LAYOUTS[name]
    marker = marker or default_marker
    for rel in candidates:
        d = Path(data_dir) / rel
        if marker is not None and (d / marker).is_file():
            return d
        if marker is None and d.is_dir() and any(d.glob("s1.*")):
            return d
    how = f"; {GET_DATA}" if name in FETCHED_SOURCES else ""
    raise DataNotFound(f"no {name} data under {data_dir} (looked in {', '.join(candidates)}){how}")


def _unique_sentences(examples: list) -> list[str]:
    sents: list[str] = []
    for e in examples:
        if isinstance(e, PairExample):
            sents += [e.anchor, e.positive] + ([e.negative] if e.negative else [])
        else:
            sents += [e.sentence1, e.sentence2]
    return list(dict.fromkeys(sents))


def _resolve_file(path: str, data_dir: str | Path | None) -> Path:
    p = Path(path)
    if not p.exists() and data_dir is not None and (Path(data_dir) / p).exists():
        return Path(data_dir) / p
    return p


def load_examples(
    kind: str,
    source: str,
    data_dir: str | Path | None = None,
    *,
    split: str = "train",
    limit: int | None = None,
) -> list:
    """Training examples of `kind` ("unlabeled" | "pairs" | "scored") from a named source.

    Sources (a named source may carry its splits, "+"-joined, after a colon: "stsb:train+dev"; else
    `split` is used; their folder is found under `data_dir`, see find_source_dir):
      stsb              scored: STS-B score 0–5          pairs: score > 4 (CLSR)
      sick              scored: SICK relatedness 1–5     (sick-nli: SICK entailment as 0/1/2)
      snli              scored: NLI 0/1/2 (contradiction < neutral < entailment)
                        pairs: entailment pairs, a contradiction of the same premise as hard negative
      nli               SNLI + MultiNLI (see find_nli_triples; dev/test: + MultiNLI dev-(mis)matched).
                        scored: 0/1/2 as snli, neutral kept (CoSENT Table II); pairs: as snli — from the
                        train split, CLSR §4.1's 314,315 entailment pairs
      nli-jsonl:<path>  one SNLI / MultiNLI jsonl file; as nli
      allnli-tsv:<path> sentence-transformers' AllNLI.tsv(.gz), rows of `split`; as nli
      nli-csv:<path>    SimCSE's CSV (sent0,sent1,hard_neg). pairs: as is; scored: (sent0, sent1) 2,
                        (sent0, hard_neg) 0
      paws, mrpc, qqp   scored: 0/1 (1 = paraphrase / duplicate). PAWS-Wiki final train/dev/test,
                        MRPC train/test, QQP (GLUE) train/dev
      text:<path>       unlabeled only: one sentence per line (a folder: all its *.txt files)
    A <path> that does not exist as given is looked up under `data_dir`. "unlabeled" from any
    labelled source gives its distinct sentences. `limit` keeps the first N examples.
    """
    if kind not in DATA_KINDS:
        raise ValueError(f"unknown data kind {kind!r}; choose from {', '.join(DATA_KINDS)}")
    name, _, arg = source.partition(":")
    name = name.strip().lower()

    if name == "text":
        if kind != "unlabeled":
            raise ValueError(f"source {source!r} only gives unlabeled sentences, not {kind!r}")
        return read_text(_resolve_file(arg, data_dir), limit)

    examples: list
    if name == "nli-csv":
        path = _resolve_file(arg, data_dir)
        examples = read_nli_csv_scored(path) if kind == "scored" else read_nli_csv_pairs(path)
        return _take(_unique_sentences(examples) if kind == "unlabeled" else examples, limit)

    triples: list[tuple[str, str, str]] | None = None  # the NLI sources
    if name == "nli-jsonl":
        triples = read_nli_jsonl(_resolve_file(arg, data_dir))
    elif name == "allnli-tsv":
        triples = read_allnli_tsv(_resolve_file(arg, data_dir), (split,))
    elif name not in ("stsb", "sick", "sick-nli", "snli", "nli", *_BINARY_READERS):
        raise ValueError(f"unknown source {source!r}; see core.data.load_examples for the names")
    splits = tuple(s.strip() for s in (arg or split).split("+"))
    if name == "nli" and data_dir is not None:
        triples = find_nli_triples(data_dir, splits)
    if triples is not None:
        examples = (nli_pairs(triples) if kind == "pairs"
                    else [ScoredPair(p, h, float(NLI_LABELS[y])) for p, h, y in triples])
        return _take(_unique_sentences(examples) if kind == "unlabeled" else examples, limit)
    if data_dir is None:
        raise ValueError(f"source {source!r} needs a data_dir")
    if name in _BINARY_READERS:
        if kind == "pairs":
            raise ValueError(f"source {source!r} gives scored pairs, not positive pairs")
        reader, files = _BINARY_READERS[name]
        unknown = set(splits) - set(files)
        if unknown:
            raise ValueError(f"{name} has no split(s) {sorted(unknown)}; choose from {', '.join(files)}")
        d = find_source_dir(name, data_dir, marker=files[splits[0]])
        examples = [p for s in splits for p in reader(d, s)]
        return _take(_unique_sentences(examples) if kind == "unlabeled" else examples, limit)
    if name == "stsb":
        d = find_source_dir("stsb", data_dir)
        if kind == "pairs":
            examples = read_stsb_pairs(d, splits)
        else:
            examples = [p for s in splits for p in read_stsb(d, s)]
    elif name in ("sick", "sick-nli"):
        if kind == "pairs":
            raise ValueError(f"source {source!r} gives scored pairs, not positive pairs")
        d = find_source_dir("sick", data_dir)
        label = "entailment" if name == "sick-nli" else "relatedness"
        examples = [p for s in splits for p in read_sick(d, s, label=label)]
    else:  # snli
        d = find_source_dir("snli", data_dir)
        triples = [t for s in splits for t in read_snli(d, s)]
        if kind == "pairs":
            examples = nli_pairs(triples)
        else:
            examples = [ScoredPair(p, h, float(NLI_LABELS[y])) for p, h, y in triples]
    return _take(_unique_sentences(examples) if kind == "unlabeled" else examples, limit)
