"""Embedding output types, made in the API process from the float vectors with sentence-transformers'
`quantize_embeddings` semantics (tests/test_output_types.py holds them equal):

- float: the vectors as they are;
- int8 / uint8: each dimension cut into 255 equal steps between the minimum and maximum the model's
  calibration set reached on it (`starts` = min, `steps` = (max - min) / 255; a dimension without spread
  takes step 1): floor((x - starts) / steps) clipped to 0..255, minus 128 for int8. The ranges are the
  export's (export/calibration.py, the manifest's `calibration`), one pair per Matryoshka dimension it
  was calibrated at; a model exported without them serves no int8 or uint8 (`unservable` says why);
- binary / ubinary: the sign bits (x > 0) packed eight to a byte, big-endian within the byte as
  numpy's packbits (dimension / 8 bytes, rounded up), as int8 (minus 128) or uint8.

Everything is one vectorised pass over the batch; int8's and binary's minus 128 is an exclusive or of the top
bit on the uint8 result (the same bytes, read as int8).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import numpy as np
import pybase64

from service.api.errors import ApiError
from service.ipc.messages import ModelInfo

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]
EMBEDDING_TYPES: tuple[str, ...] = get_args(EmbeddingType)
CALIBRATED = ("int8", "uint8")  # the types that need the model's calibration ranges
#: how to give a model its ranges, for the refusal of int8 / uint8 on an export made before them
REEXPORT = ("re-export it with this version (python -m export --model <its source> --out <dir>, "
            "optionally --data-dir <a folder holding corpus/wordnet-sentences.txt> to calibrate on a corpus)")

#: (manifest, dimension) → (manifest, starts, steps): parsed once per model and dimension; the manifest is
#: kept so that an id reused by a later dict never finds another model's ranges
_SCALES: dict[tuple[int, int], tuple[dict, np.ndarray, np.ndarray]] = {}


def ranges_of(manifest: dict[str, Any], dimension: int) -> np.ndarray | None:
    """The model's calibration ranges for vectors of `dimension` (the full one, or a Matryoshka cut it was
    calibrated at): [2, dimension] float32, minima then maxima; None where it has none."""
    calibration = manifest.get("calibration") or {}
    ranges = (calibration.get("ranges") or {}).get(str(dimension))
    return None if ranges is None else np.asarray(ranges, dtype=np.float32)


def unservable(kind: str, manifest: dict[str, Any], dimension: int, normalized: bool = True) -> str | None:
    """Why the model cannot give `kind` for vectors of `dimension`, or None when it can."""
    if kind not in CALIBRATED:
        return None
    calibration = manifest.get("calibration") or {}
    name = manifest.get("name", "this model")
    if not calibration.get("ranges"):
        return (f"model {name} carries no calibration ranges for {kind} output (its export predates them, "
                f"or gives no embeddings): {REEXPORT}; float, binary and ubinary work as they are")
    if not normalized:
        return (f"{kind} output is calibrated on normalised vectors: ask it with normalize=true (binary and "
                "ubinary take either)")
    if str(dimension) not in calibration["ranges"]:
        have = ", ".join(sorted(calibration["ranges"], key=int, reverse=True))
        return (f"model {name} was calibrated for {kind} output at dimensions {have}, not {dimension}: ask one of "
                "those, or float, binary or ubinary")
    return None


def require(kind: str, info: ModelInfo, dimensions: int | None, normalized: bool = True,
            param: str = "embedding_type") -> None:
    """Refuse (422, saying why) an output type the model cannot give, before anything is embedded. A model that
    gives no embeddings, or a dimension over the model's, is left to the embedding's own refusal."""
    dimension = dimensions or info.dimension
    if not info.gives_embeddings or dimension > info.dimension:
        return
    reason = unservable(kind, info.manifest, dimension, normalized)
    if reason is not None:
        raise ApiError(422, reason, "Validation", param=param)


def _scales(manifest: dict[str, Any], dimension: int) -> tuple[np.ndarray, np.ndarray]:
    key = (id(manifest), dimension)
    hit = _SCALES.get(key)
    if hit is not None and hit[0] is manifest:
        return hit[1], hit[2]
    ranges = ranges_of(manifest, dimension)
    if ranges is None:
        raise ValueError(unservable("int8", manifest, dimension) or "no calibration ranges")
    starts = ranges[0].copy()
    steps = (ranges[1] - starts) / np.float32(255)
    steps = np.where(steps == 0, np.float32(1), steps).astype(np.float32)
    if len(_SCALES) >= 64:  # models come and go with reloads: a bounded cache
        _SCALES.clear()
    _SCALES[key] = (manifest, starts, steps)
    return starts, steps


def convert(vectors: np.ndarray, kind: str, manifest: dict[str, Any] | None = None) -> np.ndarray:
    """`vectors` ([n, dim] float32) as `kind`: float32 as they are, [n, dim] int8 / uint8, [n, ceil(dim / 8)]
    int8 / uint8 packed bits. int8 and uint8 read the ranges from `manifest` (check `unservable` first)."""
    if kind == "float":
        return vectors
    if kind in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0, axis=-1)
        return (packed ^ np.uint8(0x80)).view(np.int8) if kind == "binary" else packed
    if kind not in CALIBRATED:
        raise ValueError(f"unknown embedding type {kind!r}; one of {', '.join(EMBEDDING_TYPES)}")
    starts, steps = _scales(manifest or {}, vectors.shape[1])
    scaled = np.subtract(vectors, starts, dtype=np.float32)
    np.divide(scaled, steps, out=scaled)
    np.floor(scaled, out=scaled)
    np.clip(scaled, 0, 255, out=scaled)
    levels = scaled.astype(np.uint8)
    return (levels ^ np.uint8(0x80)).view(np.int8) if kind == "int8" else levels


def base64_rows(matrix: np.ndarray) -> list[str]:
    """Each row's bytes in base64: float rows as little-endian float32 (OpenAI's), int8 / uint8 rows as their
    bytes. A row of a multiple of 3 bytes is a whole number of base64 chunks, so the matrix is encoded once
    and cut (one call, not one per row)."""
    if matrix.dtype not in (np.int8, np.uint8):
        matrix = np.ascontiguousarray(matrix, dtype="<f4")
    else:
        matrix = np.ascontiguousarray(matrix)
    row_bytes = matrix.shape[1] * matrix.itemsize
    if row_bytes % 3:
        return [pybase64.b64encode_as_string(row.tobytes()) for row in matrix]
    text = pybase64.b64encode_as_string(matrix.tobytes())
    width = row_bytes // 3 * 4
    return [text[i:i + width] for i in range(0, len(text), width)]
