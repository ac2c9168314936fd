"""make bench-int8 builds the anchor (sentence-transformers' one-call int8) with the config that fits the CPU."""

from __future__ import annotations

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
