"""`make data` (core/datasets.py): offline from a real folder, online from a local HTTP server, every file checked;
and every command that needs a dataset and finds none names the command that gets it."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from core import datasets
from core.data import load_examples
from core.datasets import FILES, SOURCES, Source, fetch
from tests.conftest import REPO, free_port

GET = "make data"  # what every missing-data message must name


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300, **kw)


def test_every_layout_file_has_one_source_and_the_downloads_are_real_addresses():
    given = [f for s in SOURCES for f in s.files]
    assert sorted(given) == sorted({*FILES, datasets.WIKI1M})  # each file once; wiki1m has no known sha256
    for source in SOURCES:
        assert source.url is None or source.url.startswith("https://huggingface.co/datasets/princeton-nlp/")
    assert all(len(digest) == 64 for digest in FILES.values())
    # what training and evaluation expect is what the layout holds
    from training.config import CORPUS, WIKI1M

    assert CORPUS == f"text:{datasets.CORPUS}" and WIKI1M == f"text:{datasets.WIKI1M}"


def test_offline_from_the_shared_folder_gives_the_layout_training_and_evaluation_read(shared_data, tmp_path):
    out = tmp_path / "datasets"
    result = run("-m", "core.datasets", "--out", str(out), "--from", str(shared_data))
    assert result.returncode == 0, result.stderr
    assert "could not download" not in result.stderr  # offline: no network tried
    for rel, digest in FILES.items():
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == digest, rel
    listed = dict(line.split("  ")[::-1] for line in (out / "SHA256SUMS").read_text().splitlines())
    assert listed == FILES
    # the readers find everything there
    from evaluation.sts_data import TASKS, load_task

    sizes = {name: len(load_task(name, out)) for name in TASKS}
    assert sizes == {name: len(load_task(name, shared_data)) for name in TASKS} and min(sizes.values()) > 0
    assert len(load_examples("scored", "stsb:train", out)) == 5749
    assert len(load_examples("unlabeled", "text:corpus/wordnet-sentences.txt", out)) == 135398
    # checking the folder in place (make data DATA=<it>, offline) copies nothing and passes
    again = run("-m", "core.datasets", "--out", str(out), "--from", str(out))
    assert again.returncode == 0 and "71 file(s) already in" in again.stdout, again.stdout


def test_offline_from_senteval_layout_refuses_a_file_that_differs(shared_data, tmp_path):
    downstream = tmp_path / "SentEval" / "data" / "downstream"  # SentEval's own layout: STS/, SICK/, SNLI/
    shutil.copytree(shared_data / "senteval", downstream)
    (downstream / "SICK" / "SICK_train.txt").write_text("tampered\n")
    out = tmp_path / "out"
    result = run("-m", "core.datasets", "--out", str(out), "--from", str(tmp_path / "SentEval"))
    assert result.returncode == 1
    assert "senteval/SICK/SICK_train.txt: sha256" in result.stderr and "refused" in result.stderr
    assert not (out / "senteval" / "SICK" / "SICK_train.txt").exists()  # nothing unverified written
    assert (out / "senteval" / "SICK" / "SICK_trial.txt").is_file()


def test_offline_from_an_empty_folder_fails_and_says_what_is_missing(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run("-m", "core.datasets", "--out", str(tmp_path / "out"), "--from", str(tmp_path / "empty"))
    assert result.returncode == 1 and "not complete" in result.stderr
    assert "0 of 71 file(s)" in result.stdout and "no download" in result.stdout  # the WordNet corpus's note


@pytest.fixture
def http_server(tmp_path):
    """A local HTTP server over tmp_path/www: `.url`."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    server.RequestHandlerClass.log_message = lambda *a: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.www, server.url = www, f"http://127.0.0.1:{server.server_address[1]}"
    yield server
    server.shutdown()


def _tar(path: Path, members: dict[str, bytes]) -> str:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_checks_the_archive_then_every_file(shared_data, http_server, tmp_path):
    # a small senteval.tar of real files under SentEval's folder names, as SimCSE's archive holds them
    wanted = ["senteval/STS/STS16-en-test/STS.gs.headlines.txt", "senteval/STS/STS16-en-test/STS.input.headlines.txt",
              "senteval/SNLI/labels.dev"]
    members = {"./" + rel.removeprefix("senteval/"): (shared_data / rel).read_bytes() for rel in wanted}
    members["./MR/rt-polarity.pos"] = b"a task we do not take\n"
    archive_sha = _tar(http_server.www / "senteval.tar", members)
    (http_server.www / "corpus.txt").write_text("one sentence.\nanother sentence.\n")
    sources = (
        Source("senteval", f"{http_server.url}/senteval.tar", "senteval.tar", tuple(wanted), sha256=archive_sha,
               inner_prefix="senteval/"),
        Source("corpus", f"{http_server.url}/corpus.txt", "corpus.txt", ("corpus.txt",), required=False),
    )
    out = tmp_path / "out"
    lines: list[str] = []
    report = fetch(out, sources=sources, log=lines.append)
    assert not report.failed(sources) and not report.problems
    assert {rel: report.status[rel] for rel in wanted} == dict.fromkeys(wanted, "ok")
    for rel in wanted:
        assert (out / rel).read_bytes() == (shared_data / rel).read_bytes()
    assert not (out / "MR").exists() and not (out / "senteval" / "MR").exists()
    # no known sha256: kept, said to be unverified, its checksum listed
    assert report.status["corpus.txt"] == "unverified" and any("UNVERIFIED" in line for line in lines)
    assert "corpus.txt" in (out / "SHA256SUMS").read_text()

    # an archive whose sha256 is not the expected one is deleted, and nothing of it is written
    wrong = (Source("senteval", f"{http_server.url}/senteval.tar", "senteval.tar", tuple(wanted), sha256="0" * 64,
                    inner_prefix="senteval/"),)
    bad = fetch(tmp_path / "bad", sources=wrong, log=lines.append)
    assert bad.failed(wrong) and "expected 0000" in bad.problems[0]
    assert not (tmp_path / "bad" / "senteval").exists()
    assert not (tmp_path / "bad" / ".downloads" / "senteval.tar").exists()

    # files in the archive that differ from the reference checksums are refused one by one
    members["./SNLI/labels.dev"] = b"entailment\n"
    tampered_sha = _tar(http_server.www / "tampered.tar", members)
    tampered = (Source("senteval", f"{http_server.url}/tampered.tar", "tampered.tar", tuple(wanted),
                       sha256=tampered_sha, inner_prefix="senteval/"),)
    partly = fetch(tmp_path / "partly", sources=tampered, log=lines.append)
    assert partly.status["senteval/SNLI/labels.dev"] == "mismatch" and partly.failed(tampered)
    assert not (tmp_path / "partly" / "senteval" / "SNLI" / "labels.dev").exists()


def test_no_network_says_how_to_get_the_data_offline(tmp_path):
    closed = (Source("senteval", f"http://127.0.0.1:{free_port()}/senteval.tar", "senteval.tar",
                     ("senteval/SNLI/labels.dev",), inner_prefix="senteval/"),)
    report = fetch(tmp_path / "out", sources=closed, log=lambda line: None)
    assert report.failed(closed) and "make data FROM=<folder>" in report.problems[0]


def test_make_data_runs_the_fetcher_with_data_and_from():
    out = subprocess.run(["make", "-n", "data", "DATA=/x/sets", "FROM=/media/sets"], cwd=REPO, capture_output=True,
                         text=True).stdout
    assert "-m core.datasets --out /x/sets --from /media/sets" in out
    assert "-m core.datasets --out data/datasets" in subprocess.run(["make", "-n", "data"], cwd=REPO,
                                                                    capture_output=True, text=True).stdout


# ---- every command that needs data and finds none says which command gets it ---------------------------------

def _says_make_data(result: subprocess.CompletedProcess) -> None:
    assert result.returncode != 0
    assert GET in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]


def test_evaluation_commands_without_data_name_make_data(tmp_path):
    empty = tmp_path / "none"
    _says_make_data(run("-m", "evaluation.sts", "--url", "http://127.0.0.1:9", "--data-dir", str(empty)))
    _says_make_data(run("-m", "evaluation.build_sets", "stsb", "--data-dir", str(empty), "--out", str(tmp_path / "b")))
    _says_make_data(run("-m", "evaluation.build_sets", "snli", "--data-dir", str(empty), "--out", str(tmp_path / "b")))


def test_training_without_data_names_make_data(tmp_path):
    from core.data import DataNotFound
    from training.selection import make_evaluator

    with pytest.raises(DataNotFound, match=GET):
        make_evaluator("stsb-dev", None)
    with pytest.raises(DataNotFound, match=GET):
        load_examples("unlabeled", "text:corpus/wordnet-sentences.txt", tmp_path)
    for method in ("cosent", "simcse"):  # STS-B, and the sentence corpus
        _says_make_data(run("-m", "training.train", "--method", method, "--data-dir", str(tmp_path / "none"),
                            "--set", f"runs_dir={tmp_path / 'runs'}", f"models_dir={tmp_path / 'models'}",
                            "max_steps=1"))


def _make(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """make with this test's Python environment as VENV, never rebuilt (-o: its stamp counts as up to date)."""
    venv = Path(sys.executable).parent.parent
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    return subprocess.run(["make", "-o", f"{venv}/.installed", f"VENV={venv}", f"DATA={tmp_path / 'none'}",
                           f"BEIR_DIR={tmp_path / 'beir'}", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.skipif(not (Path(sys.executable).parent.parent / ".installed").is_file()
                    or not Path("/usr/share/wordnet/data.adj").is_file(),
                    reason="make would build an environment (no venv stamp) or install WordNet first")
def test_make_eval_and_make_train_export_without_data_name_make_data(tmp_path):
    _says_make_data(_make("eval", f"MODEL={tmp_path / 'no-model'}", tmp_path=tmp_path))
    _says_make_data(_make("train-export", "METHOD=cosent",
                          f"ARGS=--set runs_dir={tmp_path / 'runs'} models_dir={tmp_path / 'models'} max_steps=1",
                          tmp_path=tmp_path))
    assert not (tmp_path / "beir").exists() or not any((tmp_path / "beir").rglob("corpus.jsonl"))
