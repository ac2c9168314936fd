"""What may be stored: document ids and metadata are checked at write time, so nothing stored can
break a later read (a 400-level nesting once made every search that returned it fail, for good)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from service.index.base import InvalidRequest, SparseRows

# Letters, digits and _-.:@, not starting with a dot: no '/', so an id is one path segment, and no
# '.' or '..', which HTTP clients normalise away (DELETE /index/documents/.. became DELETE /index).
ID_PATTERN = re.compile(r"^[A-Za-z0-9_\-:@][A-Za-z0-9_\-.:@]{0,255}$")
ID_RULE = "1-256 characters of letters, digits and _-.:@, not starting with '.'"
COLLECTION_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
COLLECTION_RULE = "a letter, then up to 63 letters, digits or _"

MAX_METADATA_DEPTH = 8
MAX_METADATA_KEYS = 256  # keys at all levels together
MAX_METADATA_BYTES = 16_384  # as compact JSON
MAX_KEY_CHARS = 128
INT64 = 2**63


def check_id(doc_id: Any) -> str:
    if not isinstance(doc_id, str) or not ID_PATTERN.match(doc_id):
        raise InvalidRequest(f"invalid document id {str(doc_id)[:80]!r}: ids are {ID_RULE}")
    return doc_id


def check_collection_name(name: Any) -> str:
    if not isinstance(name, str) or not COLLECTION_PATTERN.match(name):
        raise InvalidRequest(f"invalid collection name {str(name)[:80]!r}: names are {COLLECTION_RULE}")
    return name


def check_metadata(metadata: Any, where: str = "metadata") -> dict[str, Any]:
    if not isinstance(metadata, dict):
        raise InvalidRequest(f"{where} must be a JSON object")
    keys = _walk(metadata, where, 1)
    if keys > MAX_METADATA_KEYS:
        raise InvalidRequest(f"{where} has {keys} keys; at most {MAX_METADATA_KEYS}")
    size = len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_METADATA_BYTES:
        raise InvalidRequest(f"{where} is {size} bytes as JSON; at most {MAX_METADATA_BYTES}")
    return metadata


def _walk(value: Any, where: str, depth: int) -> int:
    """Checks types, depth and finiteness; returns the number of keys below `value`."""
    if depth > MAX_METADATA_DEPTH:
        raise InvalidRequest(f"{where} is nested deeper than {MAX_METADATA_DEPTH} levels")
    if isinstance(value, dict):
        keys = len(value)
        for k, v in value.items():
            if not isinstance(k, str) or not k or len(k) > MAX_KEY_CHARS or k.startswith("$"):
                raise InvalidRequest(f"{where}: keys are 1-{MAX_KEY_CHARS} characters, not starting with '$'")
            keys += _walk(v, f"{where}.{k}", depth + 1)
            if keys > MAX_METADATA_KEYS:  # stop early on a huge object
                return keys
        return keys
    if isinstance(value, list):
        return sum(_walk(v, f"{where}[]", depth + 1) for v in value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return 0
    if isinstance(value, int):
        if not -INT64 <= value < INT64:
            raise InvalidRequest(f"{where}: integer {value} is outside the 64-bit range")
        return 0
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequest(f"{where}: numbers must be finite")
        return 0
    raise InvalidRequest(f"{where}: unsupported value of type {type(value).__name__}")


def check_vectors(vectors: Any, rows: int, dimension: int) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape != (rows, dimension):
        raise InvalidRequest(f"expected vectors of shape ({rows}, {dimension}), got {tuple(vectors.shape)}")
    if not np.isfinite(vectors).all():
        raise InvalidRequest("vectors must hold finite numbers (no NaN or infinity)")
    return np.ascontiguousarray(vectors)


#: chunks one document may have (a 2 MB request body of text makes far fewer)
MAX_CHUNKS = 65_536


def check_chunks(doc_id: str, text: str, chunks: Any) -> None:
    """A document's chunk spans: None (one chunk, the whole text), or 1-MAX_CHUNKS [start, end) character
    spans inside its text."""
    if chunks is None:
        return
    if not isinstance(chunks, list | tuple) or not 1 <= len(chunks) <= MAX_CHUNKS:
        raise InvalidRequest(f"chunks of {doc_id!r}: a list of 1 to {MAX_CHUNKS} [start, end] spans")
    for span in chunks:
        if (not isinstance(span, list | tuple) or len(span) != 2 or not all(type(v) is int for v in span)
                or not 0 <= span[0] <= span[1] <= len(text)):
            raise InvalidRequest(f"chunks of {doc_id!r}: {str(span)[:40]} is not a [start, end] span inside its "
                                 f"text of {len(text)} characters")


def check_sparse(sparse: Any, rows: int, dimension: int) -> SparseRows:
    """A write's sparse vectors: `rows` CSR rows of indices in [0, dimension), ascending and distinct within a
    row, and finite values."""
    try:
        indptr, indices, values = (np.asarray(a) for a in sparse)
    except (TypeError, ValueError):
        raise InvalidRequest("sparse vectors are (indptr, indices, values) arrays") from None
    if indptr.shape != (rows + 1,) or indices.ndim != 1 or values.shape != indices.shape:
        raise InvalidRequest(f"expected sparse vectors of {rows} rows, got indptr of shape {indptr.shape} with "
                             f"{indices.shape} indices and {values.shape} values")
    indptr = indptr.astype(np.int64, copy=False)
    if indptr[0] != 0 or indptr[-1] != len(indices) or (np.diff(indptr) < 0).any():
        raise InvalidRequest("sparse vectors: indptr must rise from 0 to the number of indices")
    if len(indices) and (indices.min() < 0 or indices.max() >= dimension):
        raise InvalidRequest(f"sparse vectors: an index outside the model's {dimension} dimensions")
    step = np.diff(indices.astype(np.int64)) > 0  # within a row: ascending, distinct
    step[indptr[1:-1][(indptr[1:-1] > 0) & (indptr[1:-1] < len(indices))] - 1] = True  # a row's start may step down
    if not step.all():
        raise InvalidRequest("sparse vectors: each row's indices must be ascending and distinct")
    values = values.astype(np.float32, copy=False)
    if not np.isfinite(values).all():
        raise InvalidRequest("sparse vectors must hold finite numbers (no NaN or infinity)")
    return SparseRows(np.ascontiguousarray(indptr), np.ascontiguousarray(indices, dtype=np.int32),
                      np.ascontiguousarray(values))
