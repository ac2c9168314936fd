"""Bulk recording and encoding helpers give exactly what their one-at-a-time versions give."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from service.api.routes.openai import base64_rows

# values on, between, below and past the bounds, in tokens (integers) and as exact binary fractions
VALUES = [0, 1, 8, 9, 16, 17, 255, 256, 257, 4096, 40000, 3, 3, 8, 0.5, 7.75, 1e6]

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from prometheus_client import CollectorRegistry, Histogram, generate_latest, multiprocess
    from service.metrics import TOKEN_BUCKETS, BulkHistogram

    values = [float(v) for v in sys.argv[1].split(",")]
    registry = CollectorRegistry()
    one = Histogram("one_by_one", "h", buckets=TOKEN_BUCKETS, registry=registry)
    bulk = BulkHistogram("in_bulk", "h", buckets=TOKEN_BUCKETS, registry=registry)
    for v in values:
        one.observe(v)
    bulk.observe_all(np.array(values[:5]))
    bulk.observe_all(np.array([]))
    bulk.observe_all(np.array(values[5:7]))  # a small batch: observe() for each
    bulk.observe_all(np.array(values[7:]))
    if sys.argv[2] == "multiprocess":
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    print(generate_latest(registry).decode())
""")


def samples(exposition: str, name: str) -> list[str]:
    return sorted(line.replace(name, "h") for line in exposition.splitlines()
                  if line.startswith(name) and not line.startswith(f"{name}_created"))


@pytest.mark.parametrize("mode", ["single", "multiprocess"])
def test_observe_all_exposes_what_one_observe_per_value_does(mode, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    if mode == "multiprocess":  # read at import: a process of its own
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", SCRIPT, ",".join(map(str, VALUES)), mode], env=env,
                         capture_output=True, text=True, check=True).stdout
    one, bulk = samples(out, "one_by_one"), samples(out, "in_bulk")
    assert one == bulk and len(one) == 16  # 14 buckets (+Inf included), _count, _sum
    assert 'h_bucket{le="8.0"} 8.0' in one


@pytest.mark.parametrize("dim", [384, 768, 3, 1, 5])  # rows of 3k bytes encode in one call; others row by row
def test_base64_rows_are_byte_identical_to_encoding_each_row(dim):
    vectors = np.random.default_rng(dim).standard_normal((7, dim)).astype(np.float32)
    for matrix in (vectors, vectors[:, : max(1, dim // 2)]):  # and a matryoshka column slice
        expected = [base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode() for v in matrix]
        assert base64_rows(matrix) == expected
