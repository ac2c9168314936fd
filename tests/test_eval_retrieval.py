"""Retrieval harness without the service: BEIR folders, the built sets, in-process search, reports."""

import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from core import beir
from core.ranking import search_in_process
from evaluation.build_sets import main as build_main
from evaluation.build_sets import snli_retrieval, stsb_retrieval
from evaluation.retrieval import main as retrieval_main

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
TINY = FIXTURES / "beir-tiny"


class Lexical:
    """Hashed bag of words: documents sharing words with the query score higher (no model needed)."""

    name = "lexical"

    def encode(self, texts):
        out = np.full((len(texts), 64), 0.01, dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace(".", " ").replace("?", " ").split():
                out[i, zlib.crc32(w.encode()) % 64] += 1.0
        return out


def test_beir_folder_is_read_as_beir_reads_it(tmp_path):
    data = beir.load(TINY)
    assert data.qrels == {"q1": {"d1": 2, "d4": 1, "d3": 0}, "q2": {"d2": 2, "d5": 1}, "q3": {"d3": 1}}
    assert set(data.queries) == {"q1", "q2", "q3"}  # q9 has no judgements
    assert beir.BeirSet.document_text(data.corpus["d1"]) == "Music Someone plays an acoustic guitar."
    assert beir.BeirSet.document_text(data.corpus["d2"]) == "Stocks fell sharply on Monday."
    assert data.protocol == beir.Protocol()  # a real BEIR folder: BEIR's default, identical ids dropped
    beir.write(tmp_path / "copy", data)
    again = beir.load(tmp_path / "copy")
    assert (again.corpus, again.queries, again.qrels, again.protocol) == (
        data.corpus, data.queries, data.qrels, data.protocol)
    with pytest.raises(FileNotFoundError, match="dev split"):
        beir.load(TINY, "dev")


def test_in_process_search_and_metrics(tmp_path, capsys):
    run = search_in_process(Lexical(), beir.load(TINY), depth=3)
    assert set(run) == {"q1", "q2", "q3"}
    assert "q1" not in run["q1"]  # the query's own document (same id) is dropped
    assert all(len(docs) == 3 for docs in run.values())
    assert next(iter(run["q3"])) == "d3"  # "cat" and "sleeps"... shared words rank first


def test_stsb_set_follows_the_paper_on_a_fixture(tmp_path):
    data = stsb_retrieval(FIXTURES / "senteval")
    # four pairs scored 5.0 → four queries, two of them the same sentence with different partners
    assert data.queries == {"q0": "A man is playing a guitar.", "q1": "A woman is slicing an onion.",
                            "q2": "You answered your own question.", "q3": "You answered your own question."}
    texts = {i: d["text"] for i, d in data.corpus.items()}
    assert len(texts) == 14 and len(set(texts.values())) == 14  # 16 sentences, two repeats
    assert {q: texts[next(iter(j))] for q, j in data.qrels.items()}["q1"] == "A woman cuts an onion."
    assert data.protocol.ignore_identical_text
    # ranked in process: the query's own sentence is in the corpus but never retrieved
    run = search_in_process(Lexical(), data, depth=5)
    for qid, docs in run.items():
        assert data.queries[qid] not in {texts[d] for d in docs}
        assert len(docs) == 5


def test_built_sets_on_the_real_data(shared_data, tmp_path):
    assert build_main(["stsb-retrieval", "--data-dir", str(shared_data), "--out", str(tmp_path / "stsb")]) == 0
    stsb = beir.load(tmp_path / "stsb")
    assert (len(stsb.corpus), len(stsb.queries)) == (2551, 97)  # InfoCSE §6.2: 97 positive pairs
    assert all(len(j) == 1 and set(j.values()) == {1} for j in stsb.qrels.values())
    snli = snli_retrieval(shared_data)
    assert (len(snli.corpus), len(snli.queries)) == (19110, 6613)
    assert {r for judged in snli.qrels.values() for r in judged.values()} == {0, 1, 2}
    assert all(max(j.values()) > 0 for j in snli.qrels.values())


def test_cli_in_process_and_report(default_model_dir, tmp_path, capsys):
    """--model on a HF directory ranks the tiny set; the report puts two result files side by side."""
    out = tmp_path / "results"
    assert retrieval_main(["--model", str(default_model_dir), "--data", str(TINY), "--depth", "3",
                           "--out", str(out / "a" / "retrieval.json")]) == 0
    record = json.loads((out / "a" / "retrieval.json").read_text())
    assert record["queries"] == 3 and record["documents"] == 6
    # the model ranks q1: d1 (2), d4 (1); q2: d5 (1), d2 (2); q3: d3 (1) first
    metrics = record["retrieval"]
    assert metrics["MRR@10"] == 1.0 and metrics["Recall@5"] == 1.0
    assert metrics["Recall@1"] == pytest.approx((1 / 2 + 1 / 2 + 1) / 3)
    assert metrics["nDCG@1"] == pytest.approx((1 + 1 / 2 + 1) / 3)
    q2_ndcg3 = (1 + 2 / np.log2(3)) / (2 + 1 / np.log2(3))
    assert metrics["nDCG@3"] == pytest.approx((1 + q2_ndcg3 + 1) / 3)
    (out / "b").mkdir()
    (out / "b" / "sts.json").write_text(json.dumps(
        {"model": "other", "label": "other (service)", "sts": {"STS12": 70.0, "STSBenchmark": 80.0, "avg": 75.0}}))
    from evaluation.report import main as report_main

    files = [str(out / "a" / "retrieval.json"), str(out / "b" / "sts.json")]
    assert report_main([*files, "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "| other (service) | 70.00 | 80.00 | 75.00 |" in md
    assert f"| {record['label']} | – | – | – |" in md
    assert "beir-tiny nDCG@10" in md and "| other (service) | – | – | – | – | – |" in md
    assert json.loads((tmp_path / "report.json").read_text())["other (service)"]["STS-B"] == 80.0
    assert (tmp_path / "report.png").stat().st_size > 5000


def test_mteb_inputs_are_flattened():
    from evaluation.adapters import _texts

    assert _texts(["a", "b"]) == ["a", "b"]
    assert _texts([{"text": ["a", "b"]}, {"text": ["c"]}]) == ["a", "b", "c"]  # mteb 2's DataLoader batches
    with pytest.raises(TypeError):
        _texts([1])
