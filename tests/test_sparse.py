"""SPLADE exports (export/sparse.py) against sentence-transformers' SparseEncoder.encode, the service's pruning
(registry.sparsify), and the token output of embedding graphs (TEI's /embed_all) against the transformer's last
hidden state, through the backend and the engine in process."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import onnx
import pytest
import torch

from core.encoder import SentenceEncoder
from core.sparse import SpladeEncoder, is_sparse_encoder_dir
from export.__main__ import main as export_main
from export.exporter import export_onnx
from export.sparse import export_sparse
from service.api.registry import sparsify
from service.engine.backends.onnx import IntegrityError, OnnxBackend
from service.engine.core import Engine, EngineConfig
from service.ipc.messages import WrongModelType
from service.manifest import GRAPH_FILE, MANIFEST_FILE, SPARSE, TOKEN_OUTPUT, Manifest, sha256_file
from tests.tiny_models import build_splade

TEXTS = ["Hi", "A man is playing a guitar and singing loudly.", "x " * 300, "naïve café déjà-vu",
         "Stocks fell sharply on Monday."]
TOLERANCE = 1e-4
PROMPTS = {"query": "query: ", "document": ""}


def _reference(source, texts=TEXTS, **kwargs) -> np.ndarray:
    """SparseEncoder.encode's vectors, dense (its max_active_dims applied, as by default)."""
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(source), device="cpu")
    return model.encode(texts, convert_to_sparse_tensor=False, **kwargs).numpy()


def _dense(rows, dim: int) -> np.ndarray:
    out = np.zeros((len(rows), dim), dtype=np.float32)
    for i, row in enumerate(rows):
        out[i, row.indices] = row.values
    return out


@pytest.fixture(scope="module")
def splade(tmp_path_factory):
    """{name: (source, export)} for SpladePooling's two strategies and activations, one with max_active_dims and
    prompts, and sentence-transformers' two ways to hold the MLM (MLMTransformer; Transformer for fill-mask)."""
    root = tmp_path_factory.mktemp("splade")
    out = {}
    for name, options in {"max": {}, "sum-log1p": {"pooling_strategy": "sum", "activation": "log1p_relu",
                                                   "max_active_dims": 16, "prompts": PROMPTS,
                                                   "mlm_module": False}}.items():
        source = build_splade(root / "src" / name, **options)
        export_sparse(SpladeEncoder.from_pretrained(source), root / "exports" / name)
        out[name] = (source, root / "exports" / name)
    return out


@pytest.mark.parametrize("name", ["max", "sum-log1p"])
def test_a_sparse_encoder_exports_as_sparse_encoder_encodes(splade, name):
    source, export = splade[name]
    first = json.loads((source / "modules.json").read_text())[0]["type"]
    assert first.endswith("MLMTransformer" if name == "max" else ".Transformer")
    manifest = Manifest.load(export)
    assert (manifest.kind, manifest.dimension, manifest.outputs) == (SPARSE, 30522, ["sparse"])
    assert manifest.splade == {"pooling_strategy": "max" if name == "max" else "sum",
                               "activation_function": "relu" if name == "max" else "log1p_relu"}
    backend = OnnxBackend(export)
    backend.self_check()  # the recorded golden values come back
    dense = backend.encode(TEXTS, batch_size=len(TEXTS))  # one padded batch, as the service runs it
    assert (dense >= 0).all()
    expected = _reference(source)
    # what the service answers: the non-zero dimensions, pruned to the model's max_active_dims
    served = _dense(sparsify(dense, manifest.max_active_dims), dense.shape[1])
    assert np.abs(served - expected).max() <= TOLERANCE
    if manifest.max_active_dims:
        assert ((served != 0).sum(axis=1) <= manifest.max_active_dims).all()
        assert ((expected != 0).sum(axis=1) == (served != 0).sum(axis=1)).all()
    else:  # a real SPLADE's vectors are sparse: so are the tiny one's (tests/tiny_models.py), but not empty
        assert (0 < (dense > 0).sum(axis=1)).all() and ((dense > 0).sum(axis=1) < dense.shape[1] // 10).all()


def test_prompts_are_the_sparse_encoders(splade):
    source, export = splade["sum-log1p"]
    manifest = Manifest.load(export)
    assert manifest.prompts == PROMPTS and manifest.max_active_dims == 16
    served = _dense(sparsify(OnnxBackend(export).encode(["query: " + t for t in TEXTS]), 16), 30522)
    assert np.abs(served - _reference(source, prompt_name="query")).max() <= TOLERANCE


def test_sparsify_keeps_the_nonzero_dimensions_in_index_order_and_the_largest_k():
    vectors = np.array([[0, 3, 0, -5, 1, 0], [0, 0, 0, 0, 0, 0], [2, 2, 0, 0, 0, 7]], dtype=np.float32)
    rows = sparsify(vectors)
    assert [r.indices.tolist() for r in rows] == [[1, 3, 4], [], [0, 1, 5]]
    assert [r.values.tolist() for r in rows] == [[3, -5, 1], [], [2, 2, 7]]
    top = sparsify(vectors, 2)  # by magnitude, as select_max_active_dims: -5 before 3
    assert [r.indices.tolist() for r in top] == [[1, 3], [], [0, 5]] or [r.indices.tolist() for r in top] == \
        [[1, 3], [], [1, 5]]
    assert sparsify(vectors, 10)[0].indices.tolist() == [1, 3, 4]


def test_the_golden_check_catches_a_graph_that_is_not_the_recorded_one(splade, tmp_path):
    _, export = splade["max"]
    copy = tmp_path / "copy"
    copy.mkdir()
    for entry in export.iterdir():
        (copy / entry.name).symlink_to(entry)
    manifest = json.loads((export / MANIFEST_FILE).read_text())
    manifest["golden"]["values"][0][0] += 0.01
    (copy / MANIFEST_FILE).unlink()
    (copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="golden values differ"):
        OnnxBackend(copy).self_check()


@pytest.mark.parametrize(("change", "refusal"), [
    ({"pooling": {"pooling_strategy": "mean"}}, "pooling_strategy 'mean'"),
    ({"modules": "SparseAutoEncoder"}, "unsupported SparseEncoder modules"),
    ({"task": "feature-extraction"}, "transformer_task 'feature-extraction'"),
])
def test_what_the_graph_cannot_reproduce_is_refused_by_name_with_nothing_written(tmp_path, capsys, change, refusal):
    source = build_splade(tmp_path / "src")
    if "pooling" in change:
        (source / "1_SpladePooling" / "config.json").write_text(json.dumps(change["pooling"]))
    if "modules" in change:
        modules = json.loads((source / "modules.json").read_text())
        modules.append({"idx": 2, "name": "2", "path": "2_SparseAutoEncoder",
                        "type": "sentence_transformers.sparse_encoder.modules.SparseAutoEncoder"})
        (source / "modules.json").write_text(json.dumps(modules))
    if "task" in change:
        (source / "sentence_bert_config.json").write_text(json.dumps({"transformer_task": change["task"]}))
    assert is_sparse_encoder_dir(source)
    assert export_main(["--model", str(source), "--out", str(tmp_path / "out")]) == 2
    assert refusal in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_python_m_export_writes_a_sparse_export(tmp_path, capsys):
    source = build_splade(tmp_path / "src", max_active_dims=8)
    assert export_main(["--model", str(source), "--out", str(tmp_path / "out")]) == 0
    assert "sparse: vocabulary 30522" in capsys.readouterr().out
    manifest = Manifest.load(tmp_path / "out")
    assert manifest.kind == SPARSE and manifest.max_active_dims == 8 and list(manifest.variants or {}) == ["fp32"]


# --- the token output (TEI's /embed_all) ------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_export(tmp_path_factory, tiny_model_dir):
    encoder = SentenceEncoder.from_pretrained(tiny_model_dir, max_seq_length=32)
    out = tmp_path_factory.mktemp("tokens") / "tiny"
    export_onnx(encoder, out, int8=False, fp16=False)
    return encoder, out


def _hidden_states(encoder: SentenceEncoder, texts: list[str]) -> list[np.ndarray]:
    """The transformer's last hidden state of each text's tokens, each text alone (no padding)."""
    out = []
    with torch.no_grad():
        for text in texts:
            feats = encoder.tokenize([text])
            out.append(encoder.transformer(**{k: v for k, v in feats.items()}).last_hidden_state[0].numpy())
    return out


def test_the_embedding_graph_gives_each_tokens_last_hidden_state(token_export):
    encoder, export = token_export
    manifest = Manifest.load(export)
    assert manifest.outputs == ["embedding", "embedding_raw", TOKEN_OUTPUT]
    backend = OnnxBackend(export)
    assert backend.info.token_dimension == 32
    batch = backend.tokenizer.encode(TEXTS)[0]
    normalized, raw, states = backend.run_tokens(batch, int(batch.lengths.max()))
    expected = _hidden_states(encoder, TEXTS)
    for i, length in enumerate(batch.lengths):
        assert states[i, :length].shape == expected[i].shape  # special tokens included: [CLS] ... [SEP]
        assert np.abs(states[i, :length] - expected[i]).max() <= TOLERANCE
    # the same pass's pooled outputs are /embed's
    plain = backend.run(batch, int(batch.lengths.max()))
    assert np.array_equal(normalized, plain[0]) and np.array_equal(raw, plain[1])


def test_the_engine_answers_token_jobs_and_vector_jobs_in_one_pass(token_export):
    encoder, export = token_export
    backend = OnnxBackend(export)
    engine = Engine(backend, EngineConfig.from_settings(max_queue_wait_s=60))
    engine.start()
    texts = TEXTS[::-1]  # longest rows first: the job's scheduling order is not its input order
    batch = backend.tokenizer.encode(texts)[0]

    async def both():
        return await asyncio.gather(engine.embed(batch, tokens=True), engine.embed(batch))

    try:
        states, vectors = asyncio.run(both())
    finally:
        engine.stop()
    assert states.vectors.shape == (batch.tokens, 32)
    expected = _hidden_states(encoder, texts)
    for i in range(len(texts)):
        got = states.vectors[batch.offsets[i]:batch.offsets[i + 1]]
        assert np.abs(got - expected[i]).max() <= TOLERANCE
    assert np.abs(vectors.vectors - backend.encode(texts)).max() <= 1e-6


def test_an_export_without_the_token_output_is_refused_for_embed_all_saying_re_export(token_export, tmp_path):
    _, export = token_export
    old = tmp_path / "old"
    old.mkdir()
    for entry in export.iterdir():
        if entry.name not in (GRAPH_FILE, MANIFEST_FILE):
            (old / entry.name).symlink_to(entry)
    graph = onnx.load(str(export / GRAPH_FILE))  # as exports before /embed_all were: two outputs
    kept = [o for o in graph.graph.output if o.name != TOKEN_OUTPUT]
    del graph.graph.output[:]
    graph.graph.output.extend(kept)
    onnx.save(graph, str(old / GRAPH_FILE))
    manifest = json.loads((export / MANIFEST_FILE).read_text())
    digest = sha256_file(old / GRAPH_FILE)
    manifest.update(outputs=["embedding", "embedding_raw"], token_dimension=0, onnx_sha256=digest,
                    variants={"fp32": {"file": GRAPH_FILE, "sha256": digest}})
    (old / MANIFEST_FILE).write_text(json.dumps(manifest))
    backend = OnnxBackend(old)
    assert backend.info.token_dimension == 0
    engine = Engine(backend, EngineConfig.from_settings())
    engine.start()
    try:
        with pytest.raises(WrongModelType, match="re-export it with `python -m export`"):
            asyncio.run(engine.embed(backend.tokenizer.encode(["hi"])[0], tokens=True))
    finally:
        engine.stop()
