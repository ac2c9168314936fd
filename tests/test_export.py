"""ONNX export: parity with torch on padded batches, graph interface, manifest, failure modes."""

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from core.default_model import ChecksumError, verify_weights
from core.encoder import SentenceEncoder
from export.exporter import PARITY_SENTENCES, ParityError, check_parity, export_onnx
from service.engine.backends.onnx import IntegrityError, OnnxBackend
from service.manifest import Manifest, sha256_file

MIXED = ["short", "a bit longer sentence here", "x " * 400, "", "Ünïcödé and emoji 🎸 survive"]


def test_default_export_matches_torch_on_padded_batches(default_export, default_model_dir):
    torch_model = SentenceEncoder.from_pretrained(default_model_dir)
    onnx_model = OnnxBackend(default_export)
    expected = torch_model.encode(MIXED, batch_size=len(MIXED))
    # One padded batch (embed) and length-sorted sub-batches (encode) must both match torch.
    assert np.abs(onnx_model.encode(MIXED, batch_size=len(MIXED)) - expected).max() <= 1e-4
    assert np.abs(onnx_model.encode(MIXED, batch_size=2) - expected).max() <= 1e-4
    raw = onnx_model.encode(MIXED, normalize=False)
    assert np.abs(raw - torch_model.encode(MIXED, normalize=False)).max() <= 1e-4
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)


def test_default_export_matches_sentence_transformers(default_export, default_model_dir):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(default_model_dir), device="cpu")
    expected = reference.encode(MIXED, normalize_embeddings=True)
    assert np.abs(OnnxBackend(default_export).encode(MIXED) - expected).max() <= 1e-4


def test_graph_has_dynamic_axes_and_token_type_ids(default_export):
    graph = onnx.load(str(default_export / "model.onnx"), load_external_data=False).graph
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    assert inputs == {n: ["batch", "sequence"] for n in ("input_ids", "attention_mask", "token_type_ids")}
    outputs = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output}
    assert outputs == {"embedding": ["batch", 384], "embedding_raw": ["batch", 384],
                       "token_embeddings": ["batch", "sequence", 384]}  # /embed_all's


def test_manifest_describes_the_export(default_export):
    manifest = Manifest.load(default_export)
    assert manifest.dimension == 384
    assert manifest.pooling == "mean"
    assert manifest.max_seq_length == 256  # from the model's sentence_bert_config.json
    assert manifest.onnx_sha256 == sha256_file(default_export / "model.onnx")
    assert manifest.parity_max_abs_diff <= 1e-4
    assert manifest.created_at and manifest.opset == 17
    assert (default_export / "tokenizer.json").is_file()
    assert manifest.format_version == 3 and set(manifest.variants) >= {"fp32", "int8"}


def test_a_manifest_newer_than_the_service_is_refused_and_version_1_still_loads(default_export, tmp_path):
    import json

    record = json.loads((default_export / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**record, "format_version": 4}))
    with pytest.raises(ValueError, match="manifest format 4; this service reads up to 3"):
        Manifest.load(tmp_path)
    old = {k: v for k, v in record.items() if k not in ("variants", "golden")}
    (tmp_path / "manifest.json").write_text(json.dumps({**old, "format_version": 1}))
    assert Manifest.load(tmp_path).variants is None


def _retired(default_export: Path, out: Path, change) -> Path:
    """A copy of the export whose manifest `change` turns into a retired layout's."""
    shutil.copytree(default_export, out)
    record = json.loads((out / "manifest.json").read_text())
    change(record)
    (out / "manifest.json").write_text(json.dumps(record))
    return out


#: the layouts exported for a day or two, and what each manifest carried
RETIRED = {
    # the per-CPU int8 pair: a by-blocks int8 beside the row-scaled int8-avx2
    "int8-avx2": lambda r: r["variants"].update(
        {"int8-avx2": {**r["variants"]["int8"], "file": "model.int8-avx2.onnx"}}),
    # ... or the pair with its int8-avx2 refused by the gate: its by-blocks int8 alone
    "int8-avx2 left out": lambda r: r.update(variants_left_out={"int8-avx2": "its mean cosine ... (below 0.99)"}),
    # pooling that summed a batch of one row differently (the service padded it with a row)
    "no batch_invariant": lambda r: r.pop("batch_invariant"),
    "batch_invariant false": lambda r: r.update(batch_invariant=False),
}


@pytest.mark.parametrize("layout", list(RETIRED))
def test_an_export_in_a_retired_layout_is_refused_naming_the_command_that_exports_it_again(
        layout, default_export, tmp_path, monkeypatch):
    """The manifest, the backend and the service's start each refuse it, naming the manifest and the command."""
    from service import supervisor
    from service.manifest import StaleExport

    old = _retired(default_export, tmp_path / "old", RETIRED[layout])
    base_model = json.loads((old / "manifest.json").read_text())["base_model"]
    command = f"export again: python -m export --model {base_model} --out {old}"
    with pytest.raises(StaleExport) as refused:
        Manifest.load(old)
    assert str(refused.value).startswith(f"{old / 'manifest.json'}: ") and str(refused.value).endswith(command)
    with pytest.raises(StaleExport, match="a layout this service no longer reads: export again"):
        OnnxBackend(old, variant="int8")
    monkeypatch.setattr(supervisor, "_logging", lambda: None)  # leave the test session's logging alone
    for name in ("SEMBED_MODELS", "SEMBED_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SEMBED_MODEL_DIR", str(old))
    with pytest.raises(SystemExit) as start:
        supervisor.main()
    assert str(start.value) == f"cannot serve {old}: {refused.value}"


def test_a_trained_models_refusal_names_its_run_directory(default_export, tmp_path):
    from service.manifest import StaleExport

    old = _retired(default_export, tmp_path / "old", lambda r: r.update(method="cosent", batch_invariant=False))
    with pytest.raises(StaleExport, match=r"export again: python -m export --model <the run's best/ directory> --out "):
        Manifest.load(old)


def test_truncation_follows_the_model_max_length(default_export):
    encoder = OnnxBackend(default_export)
    long = " ".join(["word"] * 1000)
    assert encoder.tokenizer.encode([long])[0].lengths.tolist() == [256]
    # Everything past 256 tokens is cut, so a longer tail changes nothing.
    a, b = encoder.encode([long, long + " completely different ending"])
    assert np.abs(a - b).max() < 1e-6


@pytest.mark.parametrize("pooling", ["cls", "first_last_avg", "mean"])
def test_each_pooling_exports_with_parity(tiny_model_dir, tmp_path, pooling):
    encoder = SentenceEncoder.from_pretrained(tiny_model_dir, pooling=pooling, max_seq_length=32)
    manifest = export_onnx(encoder, tmp_path / pooling)
    assert manifest.pooling == pooling
    expected = encoder.encode(MIXED)
    assert np.abs(OnnxBackend(tmp_path / pooling).encode(MIXED) - expected).max() <= 1e-4


def test_poolings_differ(tiny_model_dir):
    vectors = {p: SentenceEncoder.from_pretrained(tiny_model_dir, pooling=p).encode(["a test sentence"])
               for p in ("cls", "first_last_avg", "mean")}
    assert not np.allclose(vectors["cls"], vectors["mean"])
    assert not np.allclose(vectors["first_last_avg"], vectors["mean"])


def test_head_is_part_of_the_graph(tiny_model_dir, tmp_path):
    encoder = SentenceEncoder.from_pretrained(tiny_model_dir, max_seq_length=32)
    torch.manual_seed(1)
    encoder.head = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU())
    encoder.head.out_features = 16
    manifest = export_onnx(encoder, tmp_path / "with-head")
    assert manifest.dimension == 16
    got = OnnxBackend(tmp_path / "with-head").encode(PARITY_SENTENCES)
    assert got.shape == (len(PARITY_SENTENCES), 16)
    assert np.abs(got - encoder.encode(PARITY_SENTENCES)).max() <= 1e-4


def test_failed_parity_leaves_nothing_behind(tiny_model_dir, tmp_path):
    encoder = SentenceEncoder.from_pretrained(tiny_model_dir, max_seq_length=32)
    with pytest.raises(ParityError):
        export_onnx(encoder, tmp_path / "bad", tolerance=-1.0)
    assert list(tmp_path.iterdir()) == []


def test_parity_check_detects_a_different_graph(tiny_model_dir, tmp_path):
    encoder = SentenceEncoder.from_pretrained(tiny_model_dir, max_seq_length=32)
    export_onnx(encoder, tmp_path / "a", int8=False, fp16=False)  # the fp32 graph is what the check reads
    with torch.no_grad():
        encoder.transformer.embeddings.word_embeddings.weight.mul_(1.5)
    assert check_parity(encoder, tmp_path / "a" / "model.onnx") > 1e-3


def test_tampered_graph_is_refused(tiny_model_dir, tmp_path):
    # the fp32 graph is the one tampered with and served
    export_onnx(SentenceEncoder.from_pretrained(tiny_model_dir, max_seq_length=32), tmp_path / "e", int8=False,
                fp16=False)
    with open(tmp_path / "e" / "model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(IntegrityError):
        OnnxBackend(tmp_path / "e")


def test_default_weights_checksum(default_model_dir, tmp_path):
    verify_weights(default_model_dir)  # the packaged weights are the published ones
    fake = tmp_path / "fake"
    fake.mkdir()
    shutil.copy(default_model_dir / "config.json", fake / "config.json")
    (fake / "model.safetensors").write_bytes(b"not the real weights")
    with pytest.raises(ChecksumError, match="sha256"):
        verify_weights(fake)


def test_export_cli(tiny_model_dir, tmp_path, capsys):
    from export.__main__ import main

    assert main(["--model", str(tiny_model_dir), "--out", str(tmp_path / "cli"), "--pooling", "cls"]) == 0
    manifest = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert manifest["pooling"] == "cls" and manifest["name"] == "cli"
    assert "make serve" in capsys.readouterr().out


FIXTURE_DATA = Path(__file__).parent / "fixtures" / "eval"


# the int8 graph's ops: every MatMul and the attention quantised per channel (QAttention, MatMulInteger), the
# feed-forward outputs of layers 0-2 each over its input's rows scaled first (ReduceMax), no MatMulNBits (whose
# kernels differ per instruction set), and the pooling's MatMul, which has no weight, left in float
INT8_OPS = {"QAttention": 6, "MatMulInteger": 18, "MatMulNBits": 0, "MatMul": 1, "ReduceMax": 3}


def test_the_export_carries_one_int8_graph_for_every_cpu_with_its_measured_quality(default_export, tmp_path):
    manifest = Manifest.load(default_export)
    assert set(manifest.variants) == {"fp32", "int8", "fp16"} and manifest.variants_left_out == {}
    assert sorted(p.name for p in default_export.glob("*.onnx")) == ["model.fp16.onnx", "model.int8.onnx",
                                                                     "model.onnx"]
    int8 = manifest.variants["int8"]
    assert int8["sha256"] == sha256_file(default_export / int8["file"])
    quality = int8["quality"]
    # the gate: at least 0.99 on the short sentences and on the long passages, measured here on the CPU
    assert quality["mean_cosine_to_fp32"] >= 0.99 and quality["mean_cosine_to_fp32_long"] >= 0.99
    assert quality["min_cosine_to_fp32_long"] <= quality["mean_cosine_to_fp32_long"]
    assert quality["stsb_dev_delta"] is None and quality["measured_on"] == "cpu"
    texts = ["A man is playing a guitar.", "Stocks fell sharply on Monday."]
    quantised = OnnxBackend(default_export, variant="int8")
    quantised.self_check()  # its own recorded golden vectors
    # the same vectors with onnxruntime's exact uint8 x int8 kernel, which CPUs without VNNI run only when asked
    # (EXACT_INT8_KERNEL): the graph's 7-bit weights never saturate the default one (on a VNNI CPU both are the
    # exact kernel), so an export made on either kind of CPU passes its golden check on the other
    import onnxruntime as ort

    from export.quantize import EXACT_INT8_KERNEL

    options = ort.SessionOptions()
    options.add_session_config_entry(EXACT_INT8_KERNEL, "1")
    exact = ort.InferenceSession(str(default_export / int8["file"]), options, providers=["CPUExecutionProvider"])
    quantised.session, recorded = exact, quantised.session
    quantised.self_check()
    quantised.session = recorded
    a, b = quantised.encode(texts), OnnxBackend(default_export).encode(texts)
    assert not np.array_equal(a, b) and ((a * b).sum(axis=1) > 0.97).all()  # really int8, and close
    ops = [n.op_type for n in onnx.load(str(default_export / int8["file"]), load_external_data=False).graph.node]
    assert {op: ops.count(op) for op in INT8_OPS} == INT8_OPS
    # SkipLayerNormalization as Add (the negated bias) + Sub (skip minus the negated product) + LayerNormalization,
    # BiasGelu as Add + FastGelu: faster on onnxruntime's CPU
    assert (ops.count("SkipLayerNormalization"), ops.count("LayerNormalization")) == (0, 12)
    assert (ops.count("BiasGelu"), ops.count("FastGelu"), ops.count("Sum"), ops.count("Sub"), ops.count("Add")) == \
        (0, 6, 0, 12, 18)
    # ... and onnxruntime does not fuse them back when it loads the graph; the bias Adds go into the int8 GEMMs,
    # but for the three row-scaled ones (after their row scale's Mul)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "as-run.onnx")
    ort.InferenceSession(str(default_export / int8["file"]), options, providers=["CPUExecutionProvider"])
    run = [n.op_type for n in onnx.load(str(tmp_path / "as-run.onnx"), load_external_data=False).graph.node]
    assert (run.count("SkipLayerNormalization"), run.count("BiasGelu"), run.count("Add"), run.count("Sum"),
            run.count("Sub")) == (0, 0, 3, 0, 12)
    assert run.count("DynamicQuantizeMatMul") == INT8_OPS["MatMulInteger"] and run.count("FastGelu") == 6
    assert (default_export / int8["file"]).stat().st_size < 0.35 * (default_export / "model.onnx").stat().st_size


def test_the_export_carries_an_fp16_variant_measured_on_the_cpu(default_export):
    manifest = Manifest.load(default_export)
    fp16 = manifest.variants["fp16"]
    assert fp16["file"] == "model.fp16.onnx" and fp16["sha256"] == sha256_file(default_export / fp16["file"])
    quality = fp16["quality"]
    assert quality["mean_cosine_to_fp32"] >= 0.999 and quality["mean_cosine_to_fp32_long"] >= 0.999
    # what was measured, and on what: never presented as a GPU measurement
    assert quality["measured_on"] == "cpu" and "not on a GPU" in quality["note"]
    assert {"Attention", "MatMul"} <= set(quality["cpu_float32_ops"])  # no float16 kernels for them on the CPU
    graph = onnx.load(str(default_export / fp16["file"]), load_external_data=False).graph
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in graph.initializer)  # the weights are float16
    kinds = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.output)}
    assert kinds == {"input_ids": onnx.TensorProto.INT64, "attention_mask": onnx.TensorProto.INT64,
                     "token_type_ids": onnx.TensorProto.INT64, "embedding": onnx.TensorProto.FLOAT,
                     "embedding_raw": onnx.TensorProto.FLOAT,
                     "token_embeddings": onnx.TensorProto.FLOAT}  # the service feeds and reads it as fp32's
    half = OnnxBackend(default_export, variant="fp16")
    half.self_check()  # its own recorded golden vectors, unit length
    texts = ["A man is playing a guitar.", " ".join(["A long text about music and guitars."] * 30)]
    a, b = half.encode(texts), OnnxBackend(default_export).encode(texts)
    assert not np.array_equal(a, b) and ((a * b).sum(axis=1) > 0.999).all()
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)  # normalised in float32


def test_the_fp16_golden_check_uses_the_vectors_recorded_for_fp16(default_export, tmp_path):
    manifest = json.loads((default_export / "manifest.json").read_text())
    recorded = np.asarray(manifest["variants"]["fp16"]["quality"]["golden_embeddings"])
    assert 0 < np.abs(recorded - np.asarray(manifest["golden"]["embeddings"])).max() < 1e-3  # fp16's own, not fp32's
    for tampered_variant in ("fp16", "fp32"):
        copy = tmp_path / tampered_variant
        shutil.copytree(default_export, copy)
        data = json.loads((copy / "manifest.json").read_text())
        golden = data["variants"]["fp16"]["quality"]["golden_embeddings"] if tampered_variant == "fp16" else \
            data["golden"]["embeddings"]
        golden[1][0] += 0.01
        (copy / "manifest.json").write_text(json.dumps(data))
        if tampered_variant == "fp16":
            with pytest.raises(IntegrityError, match=r"\(fp16\) failed its golden check: golden vectors differ"):
                OnnxBackend(copy, variant="fp16").self_check()
        else:  # fp32's recorded vectors are not what fp16 is checked against
            OnnxBackend(copy, variant="fp16").self_check()


def test_the_quality_gate_names_the_set_below_the_bar():
    from export.quantize import MIN_MEAN_COSINE, QualityError, check

    assert MIN_MEAN_COSINE == 0.99
    passing = {"mean_cosine_to_fp32": 0.995, "mean_cosine_to_fp32_long": 0.991, "stsb_dev_delta": -0.2}
    check(passing)
    with pytest.raises(QualityError, match=r"int8: its mean cosine to fp32 on the long passages is 0\.9877 "
                                           r"\(below 0\.99\)"):
        check({**passing, "mean_cosine_to_fp32_long": 0.9877})
    with pytest.raises(QualityError, match=r"fp16: its mean cosine to fp32 on the short sentences is 0\.9800"):
        check({**passing, "mean_cosine_to_fp32": 0.98}, variant="fp16")
    with pytest.raises(QualityError, match="short sentences .*; .*long passages .*; it loses 0.60 STS-B dev"):
        check({"mean_cosine_to_fp32": 0.98, "mean_cosine_to_fp32_long": 0.97, "stsb_dev_delta": -0.6})


def test_a_variant_below_the_cosine_bar_is_left_out(tiny_model_dir, tmp_path, capsys):
    encoder = SentenceEncoder.from_pretrained(tiny_model_dir, max_seq_length=32)
    refused = export_onnx(encoder, tmp_path / "refused", min_cosine=1.01)  # no graph is that close
    assert set(refused.variants) == {"fp32"}
    assert not (tmp_path / "refused" / "model.int8.onnx").exists()
    assert not (tmp_path / "refused" / "model.fp16.onnx").exists()
    err = capsys.readouterr().err
    assert "int8 variant left out: int8: its mean cosine to fp32 on the short sentences is" in err
    assert "fp16 variant left out" in err and "(below 1.01)" in err


@pytest.mark.slow  # four exports, each variant measured on STS-B dev
def test_an_int8_variant_that_loses_stsb_dev_is_left_out(tiny_model_dir, tmp_path):
    encoder = SentenceEncoder.from_pretrained(tiny_model_dir, max_seq_length=32)
    kept = export_onnx(encoder, tmp_path / "kept", data_dir=FIXTURE_DATA)
    for name in ("int8", "fp16"):  # measured on the fixture's STS-B dev
        assert kept.variants[name]["quality"]["stsb_dev_delta"] is not None
    refused = export_onnx(encoder, tmp_path / "refused", data_dir=FIXTURE_DATA, max_stsb_drop=-100.0)
    assert set(refused.variants) == {"fp32"} and not (tmp_path / "refused" / "model.int8.onnx").exists()
    assert set(export_onnx(encoder, tmp_path / "plain", int8=False, fp16=False).variants) == {"fp32"}
    assert set(export_onnx(encoder, tmp_path / "no-fp16", fp16=False).variants) == {"fp32", "int8"}


def test_the_service_serves_the_variant_it_is_told(default_export, tiny_model_dir, tmp_path, caplog):
    from fastapi.testclient import TestClient

    from service.settings import Settings
    from tests.inprocess import app_in_process

    with TestClient(app_in_process(Settings(model_dir=default_export, variant="int8"))) as c:
        info = c.get("/info").json()
        # the export's one int8 graph, whatever the CPU, and /info says which
        assert info["model_dtype"] == "int8" and info["variant"] == "int8"
        assert len(c.post("/embed", json={"inputs": "hello"}).json()[0]) == 384
    # fp16 on the CPU: onnxruntime runs it (most ops in float32 through casts) and it passes its golden check
    with TestClient(app_in_process(Settings(model_dir=default_export, variant="fp16"))) as c:
        assert c.get("/info").json()["model_dtype"] == "float16"
        assert len(c.post("/embed", json={"inputs": "hello"}).json()[0]) == 384
    # a variant the export lacks: served in fp32, with a log line that says why
    export_onnx(SentenceEncoder.from_pretrained(tiny_model_dir, max_seq_length=32), tmp_path / "e", fp16=False,
                int8=False)
    for variant in ("fp16", "int8"):
        caplog.clear()
        with caplog.at_level("WARNING", logger="sembed.engine"), \
                TestClient(app_in_process(Settings(model_dir=tmp_path / "e", variant=variant))) as c:
            assert c.get("/info").json()["model_dtype"] == "float32"
            assert len(c.post("/embed", json={"inputs": "hello"}).json()[0]) == 32
        assert f"has no {variant} variant" in caplog.text and "serving fp32" in caplog.text
