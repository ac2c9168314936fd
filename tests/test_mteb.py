"""MTEB 2 against the live service: mteb's own `OpenAIAPIEncodeWrapper` (/v1/models, /v1/embeddings) and our
`MtebServiceEncoder` (/embed) through `mteb.evaluate`, on a small STS task read from the local STS-B files.

The code run is docs/evaluation.md's block itself ("MTEB"), once per session: the
live URL put in, `mteb.get_task` answering with the local task, in a temporary folder (mteb's cache and
results go there), with every name lookup or connection to anything but this machine failing the tests
(the Hugging Face hub is never asked). Each main score must equal the Spearman that `evaluation.sts`
computes over the same pairs through the service.
"""

from __future__ import annotations

import contextlib
import re
import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.mteb

PAIRS = 300  # the first pairs of STS-B test: seconds per evaluation
DOC = Path(__file__).resolve().parent.parent / "docs" / "evaluation.md"
URL = "http://localhost:8080"


def readme_block() -> str:
    match = re.search(r"<!-- mteb-snippet -->\n```python\n(.*?)```", DOC.read_text(), re.S)
    assert match, "docs/evaluation.md has no <!-- mteb-snippet --> python block"
    return match.group(1)


@contextlib.contextmanager
def offline():
    """Name lookups and connections to anything but this machine fail as without a network (OSError); the
    attempts are listed, so a caller that swallows the error still fails the test."""
    local = {"127.0.0.1", "::1", "localhost"}
    lookup, connect = socket.getaddrinfo, socket.socket.connect
    attempts: list[str] = []

    def guarded_lookup(host, *args, **kwargs):
        if host not in local:
            attempts.append(f"lookup of {host!r}")
            raise OSError(f"no network in this test: lookup of {host!r}")
        return lookup(host, *args, **kwargs)

    def guarded_connect(sock, address):
        if isinstance(address, tuple) and address[0] not in local:
            attempts.append(f"connection to {address!r}")
            raise OSError(f"no network in this test: connection to {address!r}")
        return connect(sock, address)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket, "getaddrinfo", guarded_lookup)
        mp.setattr(socket.socket, "connect", guarded_connect)
        yield attempts


@contextlib.contextmanager
def rng_kept():
    """mteb seeds the global random generators (at import and per task): later tests get theirs back."""
    import random

    import numpy as np
    import torch

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def make_task(sample):
    """An mteb 2 STS task over `sample` (an evaluation.sts_data.StsTask), its data from memory."""
    from datasets import Dataset, DatasetDict
    from mteb.abstasks import AbsTaskSTS
    from mteb.abstasks.task_metadata import TaskMetadata

    class LocalSTSB(AbsTaskSTS):
        min_score, max_score = 0, 5
        metadata = TaskMetadata(
            name=sample.name,
            dataset={"path": "local/senteval/STS/STSBenchmark", "revision": "local"},
            description=f"The first {len(sample)} pairs of STS-B test, read from the local data folder.",
            reference="https://ixa2.si.ehu.eus/stswiki/index.php/STSbenchmark",
            type="STS", category="t2t", modalities=["text"], eval_splits=["test"], eval_langs=["eng-Latn"],
            main_score="cosine_spearman", date=("2017-01-01", "2017-12-31"), domains=["News", "Written"],
            task_subtypes=[], license="not specified", annotations_creators="human-annotated", dialect=[],
            sample_creation="found", bibtex_citation="",
        )

        def load_data(self, num_proc=None, **kwargs):
            test = Dataset.from_dict({"sentence1": sample.sentences1, "sentence2": sample.sentences2,
                                      "score": sample.scores})
            self.dataset = {"default": DatasetDict({"test": test})}
            self.data_loaded = True

    return LocalSTSB()


@pytest.fixture(scope="module")
def stsb_sample(shared_data):
    from evaluation.sts_data import StsTask, load_task

    full = load_task("STSBenchmark", shared_data)
    return StsTask(f"STSBenchmark-first{PAIRS}", full.sentences1[:PAIRS], full.sentences2[:PAIRS],
                   full.scores[:PAIRS])


@pytest.fixture(scope="module")
def expected_spearman(stsb_sample, live_service) -> float:
    """Our own harness over the same pairs through the service, on mteb's 0–1 scale."""
    from evaluation.embedders import ServiceEmbedder
    from evaluation.sts import score_task

    return score_task(stsb_sample, ServiceEmbedder(live_service.url)) / 100


@pytest.fixture(scope="module")
def readme_run(live_service, stsb_sample, tmp_path_factory):
    """The doc block's globals after running it (`results`: class name → mteb ModelResult) and its folder."""
    code = readme_block()
    assert code.count(URL) == 2
    workdir = tmp_path_factory.mktemp("mteb")
    namespace: dict = {}
    with offline() as attempts, rng_kept(), pytest.MonkeyPatch.context() as mp:
        mp.setenv("MTEB_CACHE", str(workdir / "default-cache"))  # mteb makes its default cache at import
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.chdir(workdir)
        import mteb

        task = make_task(stsb_sample)
        mp.setattr(mteb, "get_task", lambda name: task if name == "STSBenchmark" else pytest.fail(name))
        exec(compile(code.replace(URL, live_service.url), str(DOC), "exec"), namespace)
    assert not attempts, f"mteb tried the network: {attempts}"
    return namespace, workdir


def main_score(result) -> float:
    (task_result,) = result.task_results
    (scores,) = task_result.scores["test"]
    assert scores["main_score"] == scores["cosine_spearman"]
    return float(scores["main_score"])


def test_readme_block_evaluates_both_clients(readme_run, stsb_sample):
    namespace, workdir = readme_run
    assert set(namespace["results"]) == {"OpenAIAPIEncodeWrapper", "MtebServiceEncoder"}
    written = sorted(p.parent.parent.name for p in (workdir / "results" / "mteb").rglob(f"{stsb_sample.name}.json"))
    assert written == ["all-MiniLM-L6-v2", "sembed__all-MiniLM-L6-v2"]  # under the block's cache folder


def test_mteb_openai_wrapper_on_the_service(readme_run, expected_spearman):
    result = readme_run[0]["results"]["OpenAIAPIEncodeWrapper"]
    assert result.model_name == "all-MiniLM-L6-v2"
    assert main_score(result) == pytest.approx(expected_spearman, abs=1e-6)
    assert 0.8 < main_score(result) < 1  # all-MiniLM-L6-v2 on STS-B: a real score, not noise


def test_mteb_service_encoder(readme_run, expected_spearman, live_service):
    from mteb.models import EncoderProtocol, ModelMeta

    from evaluation.adapters import MtebServiceEncoder

    model = MtebServiceEncoder(live_service.url)
    assert isinstance(model, EncoderProtocol)
    meta = model.mteb_model_meta
    manifest = live_service.app.state.registry.get().info.manifest
    assert isinstance(meta, ModelMeta) and meta.name == f"sembed/{manifest['name']}"
    assert meta.revision == manifest["onnx_sha256"] and meta.embed_dim == 384 and meta.max_tokens == 256
    assert meta.similarity_fn_name == "cosine" and meta.framework == ["ONNX", "API"]

    result = readme_run[0]["results"]["MtebServiceEncoder"]
    assert (result.model_name, result.model_revision) == (meta.name, meta.revision)
    assert main_score(result) == pytest.approx(expected_spearman, abs=1e-6)
