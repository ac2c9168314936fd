"""BEIR's folder format: corpus.jsonl, queries.jsonl, qrels/<split>.tsv. Read, write, download.

A folder may also hold `protocol.json`, our addition, saying how identical query/document pairs are
treated when it is evaluated (see `Protocol`); real BEIR downloads have none and get BEIR's default.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"


PROTOCOL_FILE = "protocol.json"


@dataclass
class Protocol:
    """Which documents are dropped from a query's ranking before it is scored.

    ignore_identical_ids: a document whose id equals the query's id (BEIR's default,
        `EvaluateRetrieval.evaluate(..., ignore_identical_ids=True)`: for sets such as Quora whose
        queries are also documents).
    ignore_identical_text: a document whose text equals the query's text after whitespace
        normalisation (the in-domain STS-B protocol: a query sentence is in the corpus and must not
        find itself, whichever of its copies it is).
    """

    ignore_identical_ids: bool = True
    ignore_identical_text: bool = False
    note: str = ""


@dataclass
class BeirSet:
    corpus: dict[str, dict[str, str]]  # doc id → {"title", "text"}
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    protocol: Protocol = field(default_factory=Protocol)

    @staticmethod
    def document_text(doc: dict[str, str]) -> str:
        """Title and text as BEIR's dense models embed a document: (title + " " + text).strip()."""
        return ((doc.get("title") or "") + " " + (doc.get("text") or "")).strip()


def load(folder: str | Path, split: str = "test") -> BeirSet:
    folder = Path(folder)
    qrels_file = folder / "qrels" / f"{split}.tsv"
    for needed in (folder / "corpus.jsonl", folder / "queries.jsonl", qrels_file):
        if not needed.is_file():
            raise FileNotFoundError(f"{needed} not found: {folder} is not a BEIR folder with a {split} split")
    corpus = {}
    with open(folder / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                corpus[str(d["_id"])] = {"title": d.get("title", ""), "text": d.get("text", "")}
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        queries = {str(q["_id"]): q["text"] for q in map(json.loads, filter(str.strip, f))}
    qrels: dict[str, dict[str, int]] = {}
    with open(qrels_file, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
        next(reader, None)  # the query-id / corpus-id / score header, skipped as BEIR skips it
        for row in reader:
            if row:
                qrels.setdefault(row[0], {})[row[1]] = int(row[2])
    missing = [q for q in qrels if q not in queries]
    if missing:
        raise ValueError(f"{qrels_file}: {len(missing)} judged queries are not in queries.jsonl, e.g. {missing[:3]}")
    protocol = Protocol()
    if (folder / PROTOCOL_FILE).is_file():
        protocol = Protocol(**json.loads((folder / PROTOCOL_FILE).read_text()))
    # as BEIR's loader: the queries are those with judgements
    return BeirSet(corpus, {q: queries[q] for q in qrels}, qrels, protocol)


def write(folder: str | Path, data: BeirSet, split: str = "test") -> None:
    folder = Path(folder)
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
        for did, doc in data.corpus.items():
            f.write(json.dumps({"_id": did, "title": doc.get("title", ""), "text": doc["text"]}) + "\n")
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as f:
        for qid, text in data.queries.items():
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    with open(folder / "qrels" / f"{split}.tsv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["query-id", "corpus-id", "score"])
        for qid, docs in data.qrels.items():
            for did, rel in docs.items():
                w.writerow([qid, did, rel])
    (folder / PROTOCOL_FILE).write_text(json.dumps(asdict(data.protocol), indent=2) + "\n")


def download(name: str, out_dir: str | Path) -> Path:  # pragma: no cover - needs the internet
    """Fetch a public BEIR dataset (e.g. scifact, nfcorpus, fiqa) into out_dir/<name>, from the
    same address BEIR's own util.download_and_unzip uses."""
    import shutil
    import tempfile
    import urllib.request
    import zipfile

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as tmp:
        with urllib.request.urlopen(BEIR_URL.format(name=name), timeout=300) as r:
            shutil.copyfileobj(r, tmp)  # streamed: some sets are gigabytes
        tmp.seek(0)
        zipfile.ZipFile(tmp).extractall(out_dir)
    return out_dir / name
