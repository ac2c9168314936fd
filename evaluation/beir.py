"""BEIR's folder format: corpus.jsonl, queries.jsonl, qrels/<split>.tsv. Read, write, download."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"


@dataclass
class BeirSet:
    corpus: dict[str, dict[str, str]]  # doc id → {"title", "text"}
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]

    @staticmethod
    def document_text(doc: dict[str, str]) -> str:
        """Title and text joined as BEIR's dense models join them."""
        title = (doc.get("title") or "").strip()
        return f"{title} {doc.get('text', '')}".strip() if title else doc.get("text", "")


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
    with open(qrels_file, encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader)
        if header[:2] != ["query-id", "corpus-id"]:
            raise ValueError(f"{qrels_file}: expected a query-id/corpus-id/score header, got {header}")
        for qid, did, score in reader:
            qrels.setdefault(qid, {})[did] = int(score)
    qrels = {q: docs for q, docs in qrels.items() if q in queries}
    return BeirSet(corpus, {q: queries[q] for q in qrels}, qrels)


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


def download(name: str, out_dir: str | Path) -> Path:  # pragma: no cover - needs the internet
    """Fetch a public BEIR dataset (e.g. scifact, nfcorpus) into out_dir/<name>."""
    import io
    import urllib.request
    import zipfile

    out_dir = Path(out_dir)
    with urllib.request.urlopen(BEIR_URL.format(name=name), timeout=300) as r:
        zipfile.ZipFile(io.BytesIO(r.read())).extractall(out_dir)
    return out_dir / name
