"""Each variant of an export stands alone: one that fails for any reason is left out, named, with why; fp32 and
the other variants are written all the same. And the fp16 build yields a graph onnxruntime loads (1.31's float16
conversion repeated a Cast when two float32-kept nodes read one float16 tensor)."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from core.encoder import SentenceEncoder
from export import quantize
from export.exporter import PARITY_SENTENCES, export_onnx
from service.engine.backends.onnx import OnnxBackend
from service.manifest import Manifest


def _boom(message: str):
    def build(source: Path, out: Path, **options) -> None:
        out.write_bytes(b"half-written graph")  # a failure midway must not leave its file behind
        raise RuntimeError(message)

    return build


@pytest.fixture
def encoder(tiny_model_dir) -> SentenceEncoder:
    return SentenceEncoder.from_pretrained(tiny_model_dir, max_seq_length=32)


def _assert_fp32_served(export_dir: Path, encoder: SentenceEncoder) -> None:
    backend = OnnxBackend(export_dir)  # checks fp32's sha256 against the manifest
    backend.self_check()
    assert np.abs(backend.encode(PARITY_SENTENCES) - encoder.encode(PARITY_SENTENCES)).max() <= 1e-4


def test_an_fp16_build_that_raises_leaves_fp32_and_int8(encoder, tmp_path, monkeypatch, capsys, caplog):
    monkeypatch.setattr(quantize, "build_fp16", _boom("two nodes with same node name (X_cast_to_fp32_node)"))
    out = tmp_path / "e"
    with caplog.at_level(logging.WARNING, logger="sembed.export"):
        manifest = export_onnx(encoder, out)

    assert set(manifest.variants) == {"fp32", "int8"}
    reason = "building it failed (RuntimeError: two nodes with same node name (X_cast_to_fp32_node))"
    assert manifest.variants_left_out == {"fp16": reason}
    assert sorted(p.name for p in out.glob("*.onnx")) == ["model.int8.onnx", "model.onnx"]
    # what was written is what the manifest on disk says, and it loads through the service's model
    on_disk = Manifest.load(out)
    assert set(on_disk.variants) == {"fp32", "int8"} and on_disk.variants_left_out == {"fp16": reason}
    _assert_fp32_served(out, encoder)
    OnnxBackend(out, variant="int8").self_check()
    # the warning names the variant and why, on stderr and through logging (with the traceback)
    assert f"fp16 variant left out: {reason}" in capsys.readouterr().err
    (record,) = [r for r in caplog.records if "variant left out" in r.getMessage()]
    assert record.levelno == logging.WARNING and record.getMessage() == f"fp16 variant left out: {reason}"
    assert record.exc_info and isinstance(record.exc_info[1], RuntimeError)


def test_an_int8_build_that_raises_leaves_fp32_and_fp16(encoder, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(quantize, "build_int8", _boom("quantizer crashed"))
    manifest = export_onnx(encoder, tmp_path / "e")
    assert set(manifest.variants) == {"fp32", "fp16"}
    assert set(manifest.variants_left_out) == {"int8"} and "quantizer crashed" in manifest.variants_left_out["int8"]
    assert not (tmp_path / "e" / "model.int8.onnx").exists()
    assert manifest.variants["fp16"]["quality"]["mean_cosine_to_fp32"] >= 0.99  # still measured and gated
    assert "int8 variant left out: building it failed (RuntimeError: quantizer crashed)" in capsys.readouterr().err
    OnnxBackend(tmp_path / "e", variant="fp16").self_check()


def test_both_builds_raising_still_export_fp32(encoder, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(quantize, "build_int8", _boom("no int8"))
    monkeypatch.setattr(quantize, "build_fp16", _boom("no fp16"))
    manifest = export_onnx(encoder, tmp_path / "e")
    assert set(manifest.variants) == {"fp32"} and set(manifest.variants_left_out) == {"int8", "fp16"}
    assert [p.name for p in (tmp_path / "e").glob("*.onnx")] == ["model.onnx"]
    assert not list(tmp_path.glob(".e-*"))  # no staging folder left behind
    err = capsys.readouterr().err
    assert "int8 variant left out" in err and "fp16 variant left out" in err
    _assert_fp32_served(tmp_path / "e", encoder)


def test_a_variant_whose_measuring_raises_is_left_out(encoder, tmp_path, monkeypatch, capsys):
    def broken(graph: Path) -> list[str]:
        raise ValueError("cannot read the graph onnxruntime would run")

    monkeypatch.setattr(quantize, "cpu_float32_ops", broken)  # measured for fp16 only
    manifest = export_onnx(encoder, tmp_path / "e")
    assert set(manifest.variants) == {"fp32", "int8"}
    assert manifest.variants_left_out == {
        "fp16": "measuring it failed (ValueError: cannot read the graph onnxruntime would run)"}
    assert not (tmp_path / "e" / "model.fp16.onnx").exists()
    assert "fp16 variant left out: measuring it failed" in capsys.readouterr().err


def test_no_reference_to_measure_against_leaves_every_variant_out(encoder, tmp_path, monkeypatch):
    class Broken:
        def __init__(self, *args, **kwargs):
            raise OSError("disk full")

    monkeypatch.setattr(quantize, "Reference", Broken)
    manifest = export_onnx(encoder, tmp_path / "e")
    assert set(manifest.variants) == {"fp32"}
    why = "measuring fp32's reference vectors failed (OSError: disk full)"
    assert manifest.variants_left_out == {name: why for name in ("int8", "fp16")}
    assert [p.name for p in (tmp_path / "e").glob("*.onnx")] == ["model.onnx"]


def test_a_quality_refusal_is_recorded_with_its_reason(encoder, tmp_path):
    manifest = export_onnx(encoder, tmp_path / "e", min_cosine=1.01)  # no graph is that close
    assert set(manifest.variants) == {"fp32"}
    assert manifest.variants_left_out["int8"].startswith("int8: its mean cosine to fp32 on the short sentences")
    assert "(below 1.01)" in manifest.variants_left_out["fp16"]


def test_nothing_left_out_is_recorded_as_such_and_not_asked_for_is_not_left_out(encoder, tmp_path):
    assert export_onnx(encoder, tmp_path / "all").variants_left_out == {}
    plain = export_onnx(encoder, tmp_path / "plain", int8=False, fp16=False)
    assert set(plain.variants) == {"fp32"} and plain.variants_left_out == {}
    # an export from before the field still loads, without it
    record = json.loads((tmp_path / "plain" / "manifest.json").read_text())
    del record["variants_left_out"]
    (tmp_path / "plain" / "manifest.json").write_text(json.dumps(record))
    assert getattr(Manifest.load(tmp_path / "plain"), "variants_left_out", None) is None


def test_the_cli_names_what_was_left_out(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from export.__main__ import main

    monkeypatch.setattr(quantize, "build_fp16", _boom("boom"))
    assert main(["--model", str(tiny_model_dir), "--out", str(tmp_path / "cli"), "--no-int8"]) == 0
    out = capsys.readouterr().out
    assert "fp16: left out (building it failed (RuntimeError: boom))" in out and "make serve" in out


def test_the_quality_sets_are_data_files_the_package_ships():
    """The texts every variant is measured on are read from export/data/, which pyproject.toml ships with the
    package, so an installed wheel measures on the same texts as a checkout."""
    import fnmatch
    import tomllib

    data = Path(quantize.__file__).parent / "data"
    short, long = quantize.quality_sentences(), quantize.quality_long_sentences()
    assert short == (data / quantize.QUALITY_SHORT_FILE).read_text(encoding="utf-8").splitlines()
    assert long == (data / quantize.QUALITY_LONG_FILE).read_text(encoding="utf-8").splitlines()
    assert (len(short), len(long)) == (12, 32) and all(t and t == t.strip() for t in short + long)
    assert "naïve café déjà-vu" in short  # read as UTF-8
    shipped = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = shipped["package-data"]["export"]
    for file in data.iterdir():
        assert any(fnmatch.fnmatch(f"data/{file.name}", p) for p in patterns), file


# --- fp16: the float16 conversion's repeated Cast -----------------------------------------------------------------


def _pooled_graph(path: Path) -> None:
    """A LayerNorm (the "transformer", converted to float16), then a masked mean whose float mask two nodes read
    (Unsqueeze and ReduceSum, both after the last LayerNorm, so kept float32): the shape that made onnxruntime 1.31's
    float16 conversion add two identical Casts of the mask."""
    dim = 8
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("scale", TensorProto.FLOAT, [dim], rng.normal(1, 0.1, dim).tolist()),
             helper.make_tensor("bias", TensorProto.FLOAT, [dim], rng.normal(0, 0.1, dim).tolist()),
             helper.make_tensor("axes", TensorProto.INT64, [1], [1])]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["h"], name="ln", axis=-1),
        helper.make_node("Cast", ["mask"], ["m"], name="mask_cast", to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "minus1"], ["m3"], name="unsqueeze"),
        helper.make_node("Mul", ["h", "m3"], ["hm"], name="mul"),
        helper.make_node("ReduceSum", ["hm", "axes"], ["total"], name="sum_h", keepdims=0),
        helper.make_node("ReduceSum", ["m", "axes"], ["count"], name="sum_m", keepdims=1),
        helper.make_node("Div", ["total", "count"], ["pooled"], name="mean"),
    ]
    inits.append(helper.make_tensor("minus1", TensorProto.INT64, [1], [-1]))
    graph = helper.make_graph(
        nodes, "pooled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", dim]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", dim])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # ORT reads IR <= 13
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def test_build_fp16_gives_a_loadable_graph_when_two_float32_nodes_read_one_tensor(tmp_path):
    import onnxruntime as ort

    _pooled_graph(tmp_path / "fp32.onnx")
    quantize.build_fp16(tmp_path / "fp32.onnx", tmp_path / "fp16.onnx")

    graph = onnx.load(str(tmp_path / "fp16.onnx")).graph
    names = [n.name for n in graph.node]
    outputs = [o for n in graph.node for o in n.output]
    assert len(names) == len(set(names)) and len(outputs) == len(set(outputs))
    assert next(n for n in graph.node if n.name == "ln").op_type == "LayerNormalization"
    assert {i.name: i.data_type for i in graph.initializer}["scale"] == TensorProto.FLOAT16  # really converted
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 5, 8)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=np.int64)
    feeds = {"x": x, "mask": mask}
    run = {name: ort.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"])
           for name in ("fp32.onnx", "fp16.onnx")}  # onnxruntime refused the repeated Cast here
    (expected,), (got,) = (run[name].run(None, feeds) for name in ("fp32.onnx", "fp16.onnx"))
    assert got.dtype == np.float32
    assert not np.array_equal(got, expected) and np.abs(got - expected).max() < 1e-2  # float16, and close


def test_drop_repeated_nodes_removes_exact_repeats_only():
    cast = helper.make_node("Cast", ["m"], ["m_cast_to_fp32"], name="m_cast_to_fp32_node", to=TensorProto.FLOAT)
    other = helper.make_node("Cast", ["n"], ["n_cast_to_fp32"], name="n_cast_to_fp32_node", to=TensorProto.FLOAT)
    info = helper.make_tensor_value_info("m_cast_to_fp32", TensorProto.FLOAT, ["batch"])
    graph = helper.make_graph([cast, other, cast], "g", [], [], value_info=[info, info])
    assert quantize._drop_repeated_nodes(graph) == 1
    assert [n.name for n in graph.node] == ["m_cast_to_fp32_node", "n_cast_to_fp32_node"]
    assert [v.name for v in graph.value_info] == ["m_cast_to_fp32"]
    # same name, different node: a real conflict, not ours to resolve
    clash = helper.make_node("Cast", ["k"], ["m_cast_to_fp32"], name="m_cast_to_fp32_node", to=TensorProto.FLOAT)
    graph.node.append(clash)
    assert quantize._drop_repeated_nodes(graph) == 0 and len(graph.node) == 3


def _two_matmuls(w1: np.ndarray, w2: np.ndarray, opset: int = 17) -> onnx.ModelProto:
    """x @ w1 @ w2 as two MatMuls named "first" and "second", x of any number of rows."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"),
         helper.make_node("MatMul", ["h", "w2"], ["y"], name="second")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, w1.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, w2.shape[1]])],
        [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


@pytest.mark.parametrize("opset", [17, 18])  # ReduceMax's axes: an attribute, then an input
def test_row_scaled_keeps_the_function_and_lets_one_int8_scale_fit_every_row(tmp_path, opset):
    """int8's row-scaled MatMuls compute the same product in float (an all-zero row included: no NaN), leave
    the MatMuls not named alone, and once quantised per tensor, a row of small values next to one of large
    values keeps its precision, where the plain per-tensor int8 MatMul loses it."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    w1, w2 = rng.normal(size=(64, 32)).astype(np.float32), rng.normal(size=(32, 8)).astype(np.float32)

    def model() -> onnx.ModelProto:
        return _two_matmuls(w1, w2, opset)

    scaled = model()
    assert quantize.row_scaled(scaled, {"first"}) == 1
    onnx.checker.check_model(scaled)
    assert [n.op_type for n in scaled.graph.node][-2:] == ["Mul", "MatMul"]  # "second" untouched
    x = rng.normal(size=(6, 64)).astype(np.float32)
    x[0] *= 1000  # one token with large activations
    x[1] = 0
    expected = x @ w1 @ w2

    def run(m: onnx.ModelProto) -> np.ndarray:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    got = run(scaled)
    assert np.isfinite(got).all() and np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()
    errors = []
    for m in (model(), scaled):
        quantize_dynamic(m, str(tmp_path / "q.onnx"), per_channel=True, reduce_range=True,
                         weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"], nodes_to_exclude=["second"])
        got = run(onnx.load(str(tmp_path / "q.onnx")))
        errors.append(np.abs(got[2:] - expected[2:]).max() / np.abs(expected[2:]).max())  # the ordinary rows
    plain, rows = errors
    assert rows < 0.05 and rows < plain / 10


def test_plain_layer_norms_compute_what_skip_layer_normalization_does():
    """A SkipLayerNormalization on a float input becomes Sum + LayerNormalization: the same values, a Sum that
    onnxruntime does not fuse back into SkipLayerNormalization (it does with Add), and left alone where a later
    output is read."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    gamma, beta, bias = (rng.normal(size=16).astype(np.float32) for _ in range(3))
    inits = [onnx.numpy_helper.from_array(a, n) for a, n in ((gamma, "g"), (beta, "b"), (bias, "bias"))]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, None, 16]) for n in ("x", "s", "y")]

    def graph(outputs: list[str], extra: list) -> onnx.ModelProto:
        node = helper.make_node("SkipLayerNormalization", ["x", "s", "g", "b", "bias"], outputs, name="sln",
                                domain="com.microsoft", epsilon=1e-12)
        return helper.make_model(helper.make_graph([node], "g", io[:2], [io[2], *extra], inits), ir_version=9,
                                 opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])

    model = graph(["y"], [])
    x, s = rng.normal(size=(2, 5, 16)).astype(np.float32), rng.normal(size=(2, 5, 16)).astype(np.float32)
    fused = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert quantize.plain_layer_norms(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Sum", "LayerNormalization"]
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(Path(tempfile.mkdtemp()) / "loaded.onnx")
    plain = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert "SkipLayerNormalization" not in {n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node}
    assert np.abs(plain.run(None, {"x": x, "s": s})[0] - fused.run(None, {"x": x, "s": s})[0]).max() < 1e-5
    total = helper.make_tensor_value_info("total", TensorProto.FLOAT, [None, None, 16])
    kept = graph(["y", "", "", "total"], [total])  # its input + skip + bias sum read too: not split
    assert quantize.plain_layer_norms(kept) == 0


def test_after_an_int8_gemm_the_residual_sum_is_a_sub_of_the_negated_product(tmp_path):
    """Add + LayerNormalization would be fused back into SkipLayerNormalization, and Sum runs on one thread: after an
    int8 GEMM its weights and bias are negated and the sum is skip - (-(x W + b)), the same values."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(1)
    gamma, beta, bias = (rng.normal(size=16).astype(np.float32) for _ in range(3))
    weight = rng.normal(size=(16, 16)).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(a, n) for a, n in ((gamma, "g"), (beta, "b"), (bias, "bias"), (weight, "w"))]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, None, 16]) for n in ("x", "s", "y")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="dense"),
             helper.make_node("SkipLayerNormalization", ["xw", "s", "g", "b", "bias"], ["y"], name="sln",
                              domain="com.microsoft", epsilon=1e-12)]
    model = helper.make_model(helper.make_graph(nodes, "g", io[:2], [io[2]], inits), ir_version=9,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    quantize_dynamic(model, str(tmp_path / "q.onnx"), per_channel=True, reduce_range=True,
                     weight_type=QuantType.QInt8, extra_options={"DefaultTensorType": TensorProto.FLOAT})
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    feeds = {"x": rng.normal(size=(3, 7, 16)).astype(np.float32), "s": rng.normal(size=(3, 7, 16)).astype(np.float32)}
    expected = ort.InferenceSession(quantized.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)

    assert quantize.plain_layer_norms(quantized) == 1
    assert [n.op_type for n in quantized.graph.node][-3:] == ["Add", "Sub", "LayerNormalization"]
    assert "bias" not in {i.name for i in quantized.graph.initializer}  # replaced by its negation
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    plain = ort.InferenceSession(quantized.SerializeToString(), options, providers=["CPUExecutionProvider"])
    loaded = {n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node}
    assert "Sub" in loaded and not loaded & {"SkipLayerNormalization", "Sum", "Add"}  # the bias went into the GEMM
    assert np.abs(plain.run(None, feeds)[0] - expected[0]).max() < 1e-5  # SkipLayerNormalization's own rounding


def test_plain_gelu_computes_bias_gelu_with_the_tanh_approximation():
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    bias = onnx.numpy_helper.from_array(rng.normal(size=8).astype(np.float32), "bias")
    node = helper.make_node("BiasGelu", ["x", "bias"], ["y"], name="gelu", domain="com.microsoft")
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 8]) for n in ("x", "y")]
    model = helper.make_model(helper.make_graph([node], "g", io[:1], io[1:], [bias]), ir_version=9,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    x = rng.normal(size=(3, 8)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert quantize.plain_gelu(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Sum", "FastGelu"]
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert 0 < np.abs(got[0] - expected[0]).max() < 5e-4  # GELU's tanh approximation: within 4.7e-4 of erf's


def test_int8_weights_fit_every_x86_kernel(encoder, tmp_path):
    """build_int8's int8 GEMM weights stay within ±64, so no x86 kernel saturates (VPMADDUBSW on CPUs without
    VNNI adds two uint8 x int8 products in int16): an int8 export gives the same vectors on every x86 CPU and
    passes its golden check wherever it was made. onnxruntime's default 8-bit weights are flagged."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    export_onnx(encoder, tmp_path / "e", int8=False, fp16=False)
    config = encoder.transformer.config
    fused = quantize.fuse(tmp_path / "e" / "model.onnx", tmp_path / "fused.onnx", config.num_attention_heads,
                          config.hidden_size)
    quantize.build_int8(fused, tmp_path / "int8.onnx")
    assert quantize.saturating_int8_weights(onnx.load(str(tmp_path / "int8.onnx"))) == []
    quantize_dynamic(str(fused), str(tmp_path / "8bit.onnx"), per_channel=True, weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": TensorProto.FLOAT})
    flagged = quantize.saturating_int8_weights(onnx.load(str(tmp_path / "8bit.onnx")))
    assert len(flagged) >= 2 * config.num_hidden_layers  # every layer's QKV and FFN weights reach ±127


def test_build_int8_refuses_weights_that_would_saturate(encoder, tmp_path, monkeypatch):
    """A quantiser that ignores reduce_range (another onnxruntime release, say) gives 8-bit weights: build_int8
    refuses the graph, naming the weights, and the export leaves int8 out rather than ship it."""
    import onnxruntime.quantization as quantization

    real = quantization.quantize_dynamic
    monkeypatch.setattr(quantization, "quantize_dynamic", lambda *a, **kw: real(*a, **{**kw, "reduce_range": False}))
    export_onnx(encoder, tmp_path / "e", fp16=False)
    manifest = Manifest.load(tmp_path / "e")
    assert "int8" not in manifest.variants and not (tmp_path / "e" / quantize.INT8_FILE).exists()
    assert "would saturate x86 CPUs without VNNI" in manifest.variants_left_out["int8"]
