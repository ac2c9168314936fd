"""STS harness: SentEval-layout readers, Spearman against an independent computation, the CLI."""

import json
import zlib
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import pearsonr, rankdata

from core.sts import cosine_scores, read_stsb_split, score_task, stsb_dev_spearman
from evaluation.sts import evaluate_sts
from evaluation.sts_data import (
    SENTEVAL_SUBSETS,
    STS_YEARS,
    TASKS,
    load_task,
    read_sick_split,
    read_sts_year,
    sts_year_subsets,
)

DATA = Path(__file__).parent / "fixtures" / "eval"
FIXTURE_TASKS = ("STS12", "STSBenchmark", "SICKRelatedness")


class BagOfWords:
    """A deterministic embedder: hashed word counts plus a per-word offset (no model needed)."""

    name = "bag-of-words"

    def encode(self, texts):
        out = np.zeros((len(texts), 48))
        for i, t in enumerate(texts):
            for w in t.lower().strip(".?").split():
                h = zlib.crc32(w.encode())
                out[i, h % 48] += 1.0
                out[i, (h // 48) % 48] += 0.5
        return out.astype(np.float32) + 0.01


def spearman_by_hand(x, y):
    """Pearson correlation of average ranks, ranks computed with numpy alone."""

    def ranks(v):
        v = np.asarray(v, dtype=float)
        r = np.empty(len(v))
        r[np.argsort(v, kind="stable")] = np.arange(1, len(v) + 1)
        for value in np.unique(v):  # ties share their mean rank
            r[v == value] = r[v == value].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / np.sqrt((rx**2).sum() * (ry**2).sum()))


def test_senteval_year_reader():
    folder = DATA / "senteval" / "STS" / "STS12-en-test"
    assert sts_year_subsets(folder) == ["first", "second"]  # STS.gs.ALL.txt has no input file
    pairs = read_sts_year(folder)
    assert len(pairs) == 7  # 5 + 3 pairs, one with an empty gold line
    assert ("The sun is hot.", "It is very warm outside.", 4.0) not in pairs  # its gold line is empty
    assert ("A  cat   sleeps.", "A dog barks loudly.", 0.4) in pairs
    assert pairs[-1] == ("Two men fight.", "Two men are fighting.", 5.0)  # subsets concatenated
    task = load_task("STS12", DATA)
    assert task.sentences1[1] == "A cat sleeps."  # whitespace-normalised as SentEval does
    assert task.scores == [4.8, 0.4, 4.0, 3.6, 4.6, 0.2, 5.0]


def test_stsb_and_sick_readers():
    test = read_stsb_split(DATA, "test")
    assert len(test) == 8
    # csv.QUOTE_NONE: a lone quote stays in the sentence; fields after sentence2 are ignored
    assert test[4] == ("A cat sleeps on the sofa.", 'Stocks fell sharply on "Monday.', 0.4)
    assert read_stsb_split(DATA, "dev")[2][0] == 'He said "stop.'
    sick = read_sick_split(DATA, "test")  # CRLF line ends, a header
    assert len(sick) == 5 and sick[0] == ("A boy is playing outdoors", "A kid is playing outside", 4.6)
    assert load_task("SICKRelatedness", DATA).sentences1[2] == "Two dogs are running"


def test_spearman_matches_an_independent_computation():
    embedder = BagOfWords()
    for name in FIXTURE_TASKS:
        task = load_task(name, DATA)
        # cosine pair by pair, each side embedded separately (the harness embeds distinct sentences once)
        a, b = embedder.encode(task.sentences1), embedder.encode(task.sentences2)
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        assert np.allclose(cosine_scores(embedder.encode, task), cos, atol=1e-6)
        expected = 100 * spearman_by_hand(cos, task.scores)
        assert score_task(task, embedder) == pytest.approx(expected, abs=1e-6)
        assert score_task(task, embedder) == pytest.approx(100 * pearsonr(rankdata(cos), rankdata(task.scores))[0])


def test_evaluate_sts_and_dev_score():
    embedder = BagOfWords()
    results = evaluate_sts(embedder, data_dir=DATA, tasks=FIXTURE_TASKS)
    assert list(results) == [*FIXTURE_TASKS, "avg"]
    assert results["avg"] == pytest.approx(np.mean([results[t] for t in FIXTURE_TASKS]))
    assert results["STS12"] == score_task(load_task("STS12", DATA), embedder.encode)  # a bare function works too
    dev = load_task("STSBenchmark-dev", DATA)
    assert stsb_dev_spearman(embedder.encode, DATA) == pytest.approx(100 * spearman_by_hand(
        cosine_scores(embedder.encode, dev), dev.scores))
    with pytest.raises(ValueError):
        stsb_dev_spearman(embedder.encode, None)


def test_real_tasks_are_the_papers(shared_data):
    for year in STS_YEARS:
        folder = shared_data / "senteval" / "STS" / f"{year}-en-test"
        assert sorted(sts_year_subsets(folder)) == sorted(SENTEVAL_SUBSETS[year])
    sizes = {name: len(load_task(name, shared_data)) for name in TASKS}
    assert sizes == {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186,
                     "STSBenchmark": 1379, "SICKRelatedness": 4927}
    assert len(load_task("STSBenchmark-dev", shared_data)) == 1500


def test_cli_in_process_on_a_hf_directory(tiny_model_dir, tmp_path, capsys):
    from evaluation.embedders import TorchEmbedder, load_embedder
    from evaluation.sts import main

    assert isinstance(load_embedder(model=tiny_model_dir), TorchEmbedder)
    out = tmp_path / "sts.json"
    args = ["--model", str(tiny_model_dir), "--data-dir", str(DATA), "--tasks", *FIXTURE_TASKS, "--out", str(out)]
    assert main(args) == 0
    record = json.loads(out.read_text())
    assert list(record["sts"]) == [*FIXTURE_TASKS, "avg"]
    assert record["label"] == record["model"] == tiny_model_dir.name
    assert all(-100 <= v <= 100 for v in record["sts"].values())
    assert "| STS12 | STS-B | SICK-R | avg |" in capsys.readouterr().out


def test_load_embedder_refuses_what_it_cannot_load(tmp_path):
    from evaluation.embedders import load_embedder

    with pytest.raises(ValueError, match="exactly one"):
        load_embedder()
    with pytest.raises(ValueError, match="neither an export"):
        load_embedder(model=tmp_path)
