"""Output types (service/api/output_types.py) against sentence-transformers' own quantize_embeddings, and the
calibration ranges the export computes for them (export/calibration.py)."""

from __future__ import annotations

import base64
import dataclasses

import numpy as np
import pytest
from sentence_transformers import quantize_embeddings

from export.calibration import MATRYOSHKA_DIMENSIONS, calibration_texts, ranges
from service.api import output_types
from service.api.errors import ApiError
from service.ipc.messages import ModelInfo


def unit_rows(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def manifest_for(calibration: np.ndarray, name: str = "m") -> dict:
    return {"name": name, "calibration": {"source": "test", "sentences": len(calibration),
                                          "ranges": ranges(calibration)}}


@pytest.mark.parametrize("dim", [384, 100, 13])  # 13 and 100: packbits pads the last byte
@pytest.mark.parametrize("kind", ["binary", "ubinary"])
def test_binary_types_are_sentence_transformers_bytes(kind, dim):
    vectors = unit_rows(64, dim, dim)
    vectors[0, :5] = 0.0  # zero is not positive: a 0 bit, in both
    got = output_types.convert(vectors, kind)
    expected = quantize_embeddings(vectors, kind)
    assert got.dtype == expected.dtype and got.shape == (64, (dim + 7) // 8)
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("kind", ["int8", "uint8"])
def test_int8_types_equal_sentence_transformers_given_the_same_ranges(kind):
    calibration, served = unit_rows(500, 384, 1), unit_rows(300, 384, 2)
    manifest = manifest_for(calibration)
    served[0] = calibration.max(axis=0) + 0.1  # past the calibrated range: clipped to 255 (127), as there
    served[1] = calibration.min(axis=0) - 0.1  # and below: 0 (-128)
    got = output_types.convert(served, kind, manifest)
    expected = quantize_embeddings(served, kind, ranges=output_types.ranges_of(manifest, 384))
    assert got.dtype == expected.dtype and np.array_equal(got, expected)
    # the ranges are the calibration set's minima and maxima: the same as ST computing them from it
    assert np.array_equal(got, quantize_embeddings(served, kind, calibration_embeddings=calibration))
    assert got[0].min() == (127 if kind == "int8" else 255) and got[1].max() == (-128 if kind == "int8" else 0)


def test_a_dimension_without_spread_takes_step_one_as_sentence_transformers():
    calibration = unit_rows(50, 16, 3)
    calibration[:, 4] = 0.25
    manifest = manifest_for(calibration)
    served = unit_rows(20, 16, 4)
    assert np.array_equal(output_types.convert(served, "int8", manifest),
                          quantize_embeddings(served, "int8", ranges=output_types.ranges_of(manifest, 16)))


def test_matryoshka_ranges_are_those_of_the_cut_renormalised_vectors():
    calibration = unit_rows(400, 384, 5)
    manifest = manifest_for(calibration)
    assert sorted(manifest["calibration"]["ranges"], key=int) == ["32", "64", "128", "256", "384"]
    assert all(str(d) in manifest["calibration"]["ranges"] for d in MATRYOSHKA_DIMENSIONS if d < 384)
    cut = calibration[:, :128] / np.linalg.norm(calibration[:, :128], axis=1, keepdims=True)
    served = unit_rows(10, 384, 6)[:, :128]
    served /= np.linalg.norm(served, axis=1, keepdims=True)
    assert np.array_equal(output_types.convert(served, "uint8", manifest),
                          quantize_embeddings(served, "uint8", calibration_embeddings=cut))


def test_what_cannot_be_served_says_why():
    info = ModelInfo(model="old", dimension=384, max_seq_length=256, device="cpu", manifest={"name": "old"})
    for kind in ("float", "binary", "ubinary"):
        output_types.require(kind, info, None)  # every model gives these
    with pytest.raises(ApiError) as e:
        output_types.require("int8", info, None)
    assert e.value.status == 422 and "no calibration ranges" in e.value.message and "re-export" in e.value.message
    info = dataclasses.replace(info, manifest=manifest_for(unit_rows(20, 384, 7), "new"))
    output_types.require("uint8", info, 256)
    with pytest.raises(ApiError) as e:
        output_types.require("int8", info, 200)
    assert "384, 256, 128, 64, 32" in e.value.message and "not 200" in e.value.message
    with pytest.raises(ApiError) as e:
        output_types.require("int8", info, None, normalized=False)
    assert "normalize=true" in e.value.message
    output_types.require("binary", info, 200, normalized=False)


def test_base64_rows_are_each_rows_bytes():
    vectors = unit_rows(7, 384, 8)
    for matrix in (vectors, output_types.convert(vectors, "binary"), output_types.convert(vectors, "ubinary"),
                   output_types.convert(vectors[:, :10], "binary")):  # 2 bytes a row: encoded row by row
        rows = output_types.base64_rows(matrix)
        dtype = "<f4" if matrix.dtype == np.float32 else matrix.dtype
        decoded = np.stack([np.frombuffer(base64.b64decode(r), dtype=dtype) for r in rows])
        assert np.array_equal(decoded, matrix)


def test_calibration_reads_the_corpus_when_given_else_the_builtin_sentences(tmp_path):
    texts, source = calibration_texts(None)
    assert source == "built-in" and len(texts) > 40 and len(set(texts)) == len(texts)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "wordnet-sentences.txt").write_text("one sentence here.\n\nanother one.\n")
    assert calibration_texts(tmp_path) == (["one sentence here.", "another one."], "corpus/wordnet-sentences.txt")
    assert calibration_texts(tmp_path / "nothing-here")[1] == "built-in"
