"""TEI's /embed_sparse and /embed_all from a live `python -m service` serving the default export beside a tiny
random-weight SPLADE (tests/tiny_models.py) and a copy of the default export made as exports were before the
token output existed (SEMBED_MODELS): the sparse vectors are SparseEncoder.encode's, the token embeddings the
transformer's last hidden states, and every route a model cannot serve answers TEI's 424."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import numpy as np
import onnx
import pytest
import torch

from core.encoder import SentenceEncoder
from core.sparse import SpladeEncoder
from export.sparse import export_sparse
from service.engine.backends.onnx import OnnxBackend
from service.manifest import GRAPH_FILE, MANIFEST_FILE, TOKEN_OUTPUT, sha256_file
from tests.conftest import REPO, free_port, wait_ready
from tests.tiny_models import build_splade

TEXTS = ["A man is playing a guitar.", "Hi", "naïve café déjà-vu — unicode survives tokenisation?",
         "The quick brown fox jumps over the lazy dog while the farmer kept on ploughing his field."]
PROMPTS = {"query": "query: "}
MAX_ACTIVE_DIMS = 32
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def splade_source(tmp_path_factory):
    return build_splade(tmp_path_factory.mktemp("splade") / "src", max_active_dims=MAX_ACTIVE_DIMS, prompts=PROMPTS)


def _without_token_output(export, out):
    """`export` as exports were before /embed_all: its fp32 graph without the token output (no variants)."""
    out.mkdir()
    for entry in export.iterdir():
        if entry.name not in (GRAPH_FILE, MANIFEST_FILE) and not entry.name.startswith("model."):
            (out / entry.name).symlink_to(entry)
    graph = onnx.load(str(export / GRAPH_FILE))
    kept = [o for o in graph.graph.output if o.name != TOKEN_OUTPUT]
    del graph.graph.output[:]
    graph.graph.output.extend(kept)
    onnx.save(graph, str(out / GRAPH_FILE))
    digest = sha256_file(out / GRAPH_FILE)
    manifest = json.loads((export / MANIFEST_FILE).read_text())
    manifest.update(name="old", outputs=["embedding", "embedding_raw"], token_dimension=0, onnx_sha256=digest,
                    variants={"fp32": {"file": GRAPH_FILE, "sha256": digest}})
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def url(default_export, splade_source, tmp_path_factory):
    root = tmp_path_factory.mktemp("sparse-service")
    export_sparse(SpladeEncoder.from_pretrained(splade_source), root / "splade")
    old = _without_token_output(default_export, root / "old")
    port = free_port()
    env = {**os.environ, "SEMBED_MODELS": f"default={default_export},splade={root / 'splade'},old={old}",
           "SEMBED_PORT": str(port), "SEMBED_HOST": "127.0.0.1", "SEMBED_API_WORKERS": "1",
           "SEMBED_INDEX_PATH": ":memory:", "SEMBED_ACCESS_LOG": "false", "SEMBED_DRAIN_DELAY_S": "0"}
    log = root / "service.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc, log, timeout=240)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _sparse_reference(source, texts, **kwargs) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    return SparseEncoder(str(source), device="cpu").encode(texts, convert_to_sparse_tensor=False, **kwargs).numpy()


def _dense(answer: list[list[dict]], dim: int = 30522) -> np.ndarray:
    out = np.zeros((len(answer), dim), dtype=np.float32)
    for i, row in enumerate(answer):
        indices = [entry["index"] for entry in row]
        assert indices == sorted(indices) and len(set(indices)) == len(indices)  # ascending, each once
        assert all(entry["value"] != 0 for entry in row)  # TEI drops the zeros
        out[i, indices] = [entry["value"] for entry in row]
    return out


def test_embed_sparse_answers_sparse_encoder_encodes_vectors(url, splade_source):
    answer = httpx.post(f"{url}/embed_sparse", json={"inputs": TEXTS, "model": "splade"}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert int(answer.headers["x-compute-tokens"]) > len(TEXTS)
    rows = answer.json()
    # SparseEncoder.encode keeps the model's max_active_dims largest values by default: so does the service
    assert all(0 < len(row) <= MAX_ACTIVE_DIMS for row in rows)
    assert np.abs(_dense(rows) - _sparse_reference(splade_source, TEXTS)).max() <= TOLERANCE
    # one text: a list of one, as TEI answers; a prompt by name, as encode(prompt_name=) puts it
    single = httpx.post(f"{url}/embed_sparse", json={"inputs": TEXTS[0], "model": "splade",
                                                     "prompt_name": "query"}, timeout=60)
    expected = _sparse_reference(splade_source, TEXTS[:1], prompt_name="query")
    assert np.abs(_dense(single.json()) - expected).max() <= TOLERANCE
    # truncation as /embed's: too long without truncate is a 422 naming the input
    long = httpx.post(f"{url}/embed_sparse", json={"inputs": ["x " * 200], "model": "splade", "truncate": False},
                      timeout=60)
    assert long.status_code == 422 and "inputs[0]" in long.json()["error"], long.text


def test_embed_all_answers_each_tokens_last_hidden_state(url):
    """TEI's /embed_all: every token, special ones included, as the transformer outputs it (not normalised); with
    tei-client's call, as its docs show."""
    from tei_client import HttpClient

    from core.default_model import default_model_dir

    encoder = SentenceEncoder.from_pretrained(default_model_dir())
    expected = []
    with torch.no_grad():
        for text in TEXTS:
            expected.append(encoder.transformer(**encoder.tokenize([text])).last_hidden_state[0].numpy())
    got = HttpClient(url).embed_all(TEXTS)  # the default model
    assert len(got) == len(TEXTS)
    for tokens, reference in zip(got, expected):
        tokens = np.asarray(tokens, dtype=np.float32)
        assert tokens.shape == reference.shape  # [CLS] ... [SEP], 384 each
        assert np.abs(tokens - reference).max() <= TOLERANCE
    single = httpx.post(f"{url}/embed_all", json={"inputs": TEXTS[1], "model": "default"}, timeout=60)
    assert np.abs(np.asarray(single.json()[0]) - expected[1]).max() <= TOLERANCE
    assert int(single.headers["x-compute-tokens"]) == len(expected[1])


@pytest.mark.parametrize(("route", "body", "says", "then"), [
    ("/embed_sparse", {"inputs": "hi"}, "Model is not an embedding model with SPLADE pooling", "'default'"),
    ("/embed_all", {"inputs": "hi", "model": "splade"}, "`embed_all` is not available for SPLADE models",
     "/embed_sparse"),
    ("/embed", {"inputs": "hi", "model": "splade"}, "`normalize` is not available for SPLADE models", "'splade'"),
    ("/embed_all", {"inputs": "hi", "model": "old"}, "`embed_all` is not available",
     "re-export it with `python -m export`"),
])
def test_a_route_the_model_cannot_serve_answers_teis_424_saying_why(url, route, body, says, then):
    """TEI's sentence first (what its clients match), then which model and what to do."""
    answer = httpx.post(f"{url}{route}", json=body, timeout=60)
    assert answer.status_code == 424, answer.text
    error = answer.json()
    assert error["error_type"] == "Backend" and error["error"].startswith(says) and then in error["error"], error


def test_embed_on_a_sparse_model_without_normalize_is_its_dense_vector(url, splade_source):
    """As TEI's /embed on a SPLADE model: the vocabulary-sized vector, whole, when normalize is false."""
    answer = httpx.post(f"{url}/embed", json={"inputs": TEXTS[:2], "model": "splade", "normalize": False}, timeout=60)
    assert answer.status_code == 200, answer.text
    dense = np.asarray(answer.json(), dtype=np.float32)
    sparse = httpx.post(f"{url}/embed_sparse", json={"inputs": TEXTS[:2], "model": "splade"}, timeout=60).json()
    assert dense.shape == (2, 30522)
    # the service's top-k is of this vector
    for row, answered in zip(dense, sparse):
        assert sorted(np.argsort(-row)[:MAX_ACTIVE_DIMS].tolist()) == [entry["index"] for entry in answered]


def test_the_int8_and_fp16_graphs_carry_the_token_output(default_export):
    """The variants are built from the fp32 graph, its outputs kept: /embed_all serves them too, each token's state
    as close to fp32's as the variant's vectors are."""
    fp32 = OnnxBackend(default_export, verify=False)
    batch = fp32.tokenizer.encode(TEXTS)[0]
    seq_len = int(batch.lengths.max())
    reference = fp32.run_tokens(batch, seq_len)[2]
    mask = np.arange(seq_len) < batch.lengths[:, None]
    for variant in ("int8", "fp16"):
        served = OnnxBackend(default_export, variant=variant, verify=False, pad_to_multiple_of=1)
        assert served.info.token_dimension == 384
        states = served.run_tokens(batch, seq_len)[2][mask]
        cosine = (states * reference[mask]).sum(1) / np.linalg.norm(states, axis=1) / \
            np.linalg.norm(reference[mask], axis=1)
        assert cosine.mean() > 0.95, (variant, cosine.mean())
