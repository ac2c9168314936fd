"""make bench-int8 builds the anchor (sentence-transformers' one-call int8) with the config that fits the CPU."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from benchmarks.int8_anchor import anchor_config


@pytest.mark.parametrize(("flags", "arch", "config"), [
    ({"avx2", "avx512f", "avx512_vnni"}, "x86_64", "avx512_vnni"),  # e.g. the 2-core EPYC, Ice Lake and later
    ({"avx2", "avx512f"}, "x86_64", "avx2"),  # AVX-512 without VNNI: sentence-transformers' avx512 is not asked for
    ({"avx2", "avx_vnni"}, "x86_64", "avx2"),  # AVX-VNNI (256-bit) only
    ({"avx2"}, "x86_64", "avx2"),
    ({"asimd", "asimddp"}, "aarch64", "arm64"),
    (set(), "arm64", "arm64"),
])
def test_the_anchor_config_follows_the_cpu(flags, arch, config):
    assert anchor_config(flags, arch) == config


def test_the_int8_profile_shows_where_time_goes_and_that_the_kernels_agree(default_export, tmp_path, capsys):
    """`python -m benchmarks.int8_profile`: the export's int8 graph's kernel time by op type and weight shape (its
    one int8 graph, row-scaled: every dense MatMul a per-channel int8 GEMM, ReduceMax, no MatMulNBits), and no
    difference between onnxruntime's default and exact int8 kernels (7-bit weights)."""
    from benchmarks.int8_profile import main

    assert main(["--model-dir", str(default_export), "--data-dir", str(tmp_path), "--long", "64"]) == 0
    out = capsys.readouterr().out
    sections = {s.split(" ", 1)[0]: s for s in out.split("\n\n") if s.startswith("int8")}
    assert set(sections) == {"int8"}
    text = sections["int8"]
    gemms = dict(re.findall(r"DynamicQuantizeMatMul (\d+x\d+) +(\d+) ", text))
    assert gemms == {"384x1536": "6", "1536x384": "6", "384x384": "6"}, text  # every dense MatMul, by weight shape
    assert re.search(r"QAttention 384x1152 +6 ", text)
    assert "MatMulNBits" not in text and "ReduceMax" in text
    assert "max |default int8 kernel - exact kernel|: golden sentences 0.0e+00, long texts 0.0e+00" in text

    # several graphs take turns in one process, each profiled on its own: fp32 has float MatMuls and Attention
    fp32, int8 = default_export / "model.onnx", default_export / "model.int8.onnx"
    assert main(["--model-dir", str(default_export), "--data-dir", str(tmp_path), "--long", "32", "--rounds", "1",
                 "--graph", str(fp32), "--graph", str(int8)]) == 0
    first, second = [s for s in capsys.readouterr().out.split("\n\n") if "ms per batch" in s]
    assert first.startswith(str(fp32)) and second.startswith(str(int8))
    assert re.search(r"MatMul 384x1536 +6 ", first) and "DynamicQuantizeMatMul" not in first
    assert re.search(r"DynamicQuantizeMatMul 384x1536 +6 ", second)


def test_int8_configs_builds_the_row_scaled_settings(tiny_model_dir, tmp_path):
    """`python -m benchmarks.int8_configs "7-bit, rows: ..."`: the row-scaled candidates RESULTS.md compares are
    built by the repo's own functions, with the rows named and every MatMul int8."""
    import onnx

    from benchmarks.int8_configs import CONFIGS, build
    from core.encoder import SentenceEncoder
    from export.exporter import export_onnx
    from export.quantize import fuse

    encoder = SentenceEncoder.from_pretrained(tiny_model_dir, max_seq_length=32)
    export_onnx(encoder, tmp_path / "e", int8=False, fp16=False)
    config = encoder.transformer.config
    plain = tmp_path / "e" / "model.onnx"
    fused = fuse(plain, tmp_path / "fused.onnx", config.num_attention_heads, config.hidden_size)
    expected = {"7-bit, rows: FFN outputs of layers 0, 2": 1, "7-bit, rows: all 6 FFN inputs and outputs": 4}
    for name, row_scaled_matmuls in expected.items():  # the tiny model has 2 layers: its own
        assert name in CONFIGS
        build(name, fused, plain, tmp_path / "int8.onnx")
        ops = [n.op_type for n in onnx.load(str(tmp_path / "int8.onnx"), load_external_data=False).graph.node]
        assert ops.count("ReduceMax") == row_scaled_matmuls and "MatMulInteger" in ops


def test_the_speed_verdict_prints_the_rounds_own_ratios_beside_the_ratio_of_medians():
    from benchmarks.int8_anchor import NO_SPIN, targets

    def row(short, long):
        return {"short": {"median": sorted(short)[1], "rounds": short, "mean_cosine": 0.995},
                "long": {"median": sorted(long)[1], "rounds": long, "mean_cosine": 0.992}}

    anchor = "anchor int8 (avx2)"
    rows = {"fp32": row([1, 1, 1], [1, 1, 1]), anchor: row([90, 180, 100], [10, 10, 10]),
            f"{anchor}{NO_SPIN}": row([100, 100, 100], [10, 10, 10]),
            "int8": row([100, 200, 120], [12, 12, 12]), f"int8{NO_SPIN}": row([110, 110, 110], [11, 11, 11])}
    checks = dict(targets({"contenders": rows, "anchor_config": "avx2", "golden": {"int8": None}}, anchor, ["int8"]))
    short = next(text for text in checks if "short, both spinning" in text)
    assert "(1.20×; median of the rounds' own ratios 1.11×)" in short and checks[short]  # medians 120 / 100
    assert not checks[next(text for text in checks if "short, both without spinning" in text)]  # 1.10×


def test_the_op_bench_times_every_case_and_the_fusion_it_names_happens():
    import onnx
    import onnxruntime as ort

    from benchmarks import onnx_ops as ops

    times = ops.time_ops(threads=1, runs=1)
    assert set(times) == set(ops.graphs()) and all(t > 0 for t in times.values())
    graph, _, _ = ops.graphs()["Add + LayerNormalization (loaded: SkipLayerNormalization)"]
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(Path(tempfile.mkdtemp()) / "loaded.onnx")
    ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    assert [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node] == ["SkipLayerNormalization"]
