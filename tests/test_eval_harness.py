"""STS and retrieval harness: readers, scoring vs an independent computation, service vs in process."""

import json
from pathlib import Path

import numpy as np
import pytest

from evaluation import beir
from evaluation.build_sets import snli_retrieval, stsb_retrieval
from evaluation.embedders import OnnxEmbedder, ServiceEmbedder, load_embedder
from evaluation.retrieval import search_in_process, search_service
from evaluation.sts import score_task
from evaluation.sts_data import StsTask, load_task, read_sts_year

FIXTURES = Path(__file__).parent / "fixtures"


def spearman_by_hand(x, y):
    def ranks(v):  # average ranks for ties, as Spearman's definition needs
        v = np.asarray(v, dtype=float)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(1, len(v) + 1)
        for value in np.unique(v):
            r[v == value] = r[v == value].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / np.sqrt((rx**2).sum() * (ry**2).sum()))


def test_senteval_year_reader_skips_unscored_and_summary_files():
    pairs = read_sts_year(FIXTURES / "sts" / "STS12-en-test")
    assert len(pairs) == 7  # 5 + 3 pairs, one without gold; STS.gs.ALL.txt has no input file
    assert ("A  cat   sleeps.", "A dog barks loudly.", 0.4) in pairs
    task = load_task("STS12", FIXTURES / "sts")
    assert "A cat sleeps." in task.sentences1  # whitespace-normalised as SentEval does


def test_sts_score_matches_an_independent_computation(default_export):
    task = load_task("STS12", FIXTURES / "sts")
    embedder = OnnxEmbedder(default_export)
    a = embedder.encode(task.sentences1)
    b = embedder.encode(task.sentences2)
    cos = [float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)) for x, y in zip(a, b)]
    assert score_task(task, embedder.encode) == pytest.approx(100 * spearman_by_hand(cos, task.scores), abs=1e-9)


def test_real_task_sizes(shared_data):
    sizes = {name: len(load_task(name, shared_data)) for name in ("STS12", "STS13", "STS14", "STS15", "STS16",
                                                                 "STSBenchmark", "SICKRelatedness")}
    assert sizes == {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186,
                     "STSBenchmark": 1379, "SICKRelatedness": 4927}


def test_service_and_in_process_agree_on_sts(live_service, default_export, shared_data):
    full = load_task("STS16", shared_data)
    task = StsTask("STS16[:300]", full.sentences1[:300], full.sentences2[:300], full.scores[:300])
    over_http = score_task(task, ServiceEmbedder(live_service.url).encode)
    in_process = score_task(task, load_embedder(model=default_export).encode)
    assert abs(over_http - in_process) < 0.01
    assert 70 < in_process < 90


def test_stsb_retrieval_set(shared_data):
    data = stsb_retrieval(shared_data)
    assert sum(len(d) for d in data.qrels.values()) == 97  # the paper's 97 pairs scored 5.0
    assert all(q in data.corpus for q in data.queries)  # queries are corpus sentences, same ids
    for qid, judged in data.qrels.items():
        assert qid not in judged


def test_snli_retrieval_set_is_graded(shared_data):
    data = snli_retrieval(shared_data)
    grades = {r for judged in data.qrels.values() for r in judged.values()}
    assert grades == {0, 1, 2}
    assert len(data.corpus) > 15_000 and len(data.queries) > 5_000


@pytest.fixture
def tiny_beir(tmp_path):
    corpus = {
        "q1": {"title": "", "text": "A man is playing a guitar."},
        "d1": {"title": "Music", "text": "Someone plays an acoustic guitar."},
        "d2": {"title": "", "text": "Stocks fell sharply on Monday."},
        "d3": {"title": "", "text": "A cat sleeps on the sofa."},
        "d4": {"title": "", "text": "The orchestra performs a symphony."},
    }
    data = beir.BeirSet(corpus, {"q1": "A man is playing a guitar.", "q2": "Financial markets dropped."},
                        {"q1": {"d1": 2, "d4": 1}, "q2": {"d2": 1}})
    beir.write(tmp_path / "tiny", data)
    return tmp_path / "tiny"


def test_beir_round_trip_and_title_join(tiny_beir):
    data = beir.load(tiny_beir)
    assert data.qrels == {"q1": {"d1": 2, "d4": 1}, "q2": {"d2": 1}}
    assert beir.BeirSet.document_text(data.corpus["d1"]) == "Music Someone plays an acoustic guitar."


def test_retrieval_through_the_service_matches_in_process(live_service, default_export, tiny_beir):
    data = beir.load(tiny_beir)
    over_http = search_service(live_service.url, data, depth=3)
    in_process = search_in_process(OnnxEmbedder(default_export), data, depth=3)
    assert "q1" not in over_http["q1"] and "q1" not in in_process["q1"]  # identical ids dropped
    for q in data.queries:
        assert list(over_http[q]) == list(in_process[q])
        assert np.allclose(list(over_http[q].values()), list(in_process[q].values()), atol=1e-5)
        assert len(over_http[q]) == 3
    assert next(iter(over_http["q1"])) == "d1" and next(iter(over_http["q2"])) == "d2"


def test_retrieval_cli_writes_metrics(live_service, tiny_beir, tmp_path, capsys):
    from evaluation.retrieval import main

    assert main(["--url", live_service.url, "--data", str(tiny_beir), "--out", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["retrieval"]["Recall@1"] == pytest.approx(0.75)  # q1: d1 of {d1, d4}; q2: d2
    assert result["retrieval"]["MRR@10"] == pytest.approx(1.0)
    assert "nDCG@10" in capsys.readouterr().out


def test_ecosystem_adapters(live_service, default_export):
    from evaluation.adapters import BeirServiceModel, MtebServiceEncoder

    expected = OnnxEmbedder(default_export).encode(["Music Someone plays.", "query text"])
    model = BeirServiceModel(live_service.url)
    corpus = model.encode_corpus([{"title": "Music", "text": "Someone plays."}], batch_size=8)
    assert np.allclose(corpus[0], expected[0], atol=1e-5)
    assert np.allclose(model.encode_queries(["query text"], batch_size=8)[0], expected[1], atol=1e-5)
    assert MtebServiceEncoder(live_service.url).encode(["query text"]).shape == (1, 384)


def test_service_errors_are_reported(live_service):
    from evaluation.embedders import HttpClient, ServiceError

    with pytest.raises(ServiceError, match="422"):
        HttpClient(live_service.url).request("POST", "/embed", {"inputs": []})
    with pytest.raises(ServiceError, match="cannot reach"):
        HttpClient("http://127.0.0.1:9", retries=0).request("GET", "/info")


def test_report(tmp_path):
    from evaluation.report import main

    (tmp_path / "a.json").write_text(json.dumps({"model": "m1", "sts": {"STS12": 70.0, "avg": 70.0}}))
    (tmp_path / "b.json").write_text(json.dumps({"model": "m2", "dataset": "set", "retrieval": {
        "nDCG@10": 0.5, "Recall@1": 0.25, "Recall@10": 0.75, "MRR@10": 0.5}}))
    assert main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "| m1 | 70.00 | 70.00 | – |" in md and "| m2 | – | – | 50.00 |" in md
    assert (tmp_path / "report.png").stat().st_size > 1000
