"""make bench-int8 builds the anchor (sentence-transformers' one-call int8) with the config that fits the CPU."""

from __future__ import annotations

import re

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
    """`python -m benchmarks.int8_profile`: each int8 graph's kernel time by op type (MatMulNBits only in the
    by-blocks graph, ReduceMax only in the row-scaled one), and no difference between onnxruntime's default and
    exact int8 kernels (7-bit weights)."""
    from benchmarks.int8_profile import main

    assert main(["--model-dir", str(default_export), "--data-dir", str(tmp_path), "--long", "64"]) == 0
    out = capsys.readouterr().out
    sections = {s.split(" ", 1)[0]: s for s in out.split("\n\n") if s.startswith("int8")}
    assert set(sections) == {"int8", "int8-avx2"}
    gemms = {"int8": 16, "int8-avx2": 18}  # int8-avx2's row-scaled FFN outputs are per-channel int8 GEMMs too
    for name, text in sections.items():
        assert re.search(rf"DynamicQuantizeMatMul +{gemms[name]} ", text) and re.search(r"QAttention +6 ", text)
        assert ("MatMulNBits" in text) == (name == "int8") and ("ReduceMax" in text) == (name == "int8-avx2")
        assert "max |default int8 kernel - exact kernel|: golden sentences 0.0e+00, long texts 0.0e+00" in text
