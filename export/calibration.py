"""The ranges an embedding export carries for int8 / uint8 output (service/api/output_types.py).

sentence-transformers' `quantize_embeddings(embeddings, "int8", calibration_embeddings=...)` cuts each dimension
between the minimum and maximum a calibration set reaches on it. Computed here once, at export, on the fp32
graph's normalised vectors (what the service serves by default), for the full dimension and for each common
Matryoshka cut below it (the first d components renormalised, as the service's `dimensions` /
`output_dimension` makes them). The texts: the first `CORPUS_SENTENCES` lines of the unlabelled corpus under
`data_dir` when there is one, else the fixed sentences and passages the export already embeds for its quality
checks (export/quantize.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from core.data import read_text
from core.datasets import CORPUS, WIKI1M
from export import quantize

#: how many corpus sentences calibrate (sentence-transformers' examples calibrate on a few thousand)
CORPUS_SENTENCES = 2000
#: Matryoshka cuts calibrated besides the full dimension, where below it: the sizes Matryoshka models train
#: and clients ask for (nomic, OpenAI's text-embedding-3, Cohere's embed-v4)
MATRYOSHKA_DIMENSIONS = (32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072)


def builtin_sentences() -> list[str]:
    """The texts the export embeds anyway for its variants' quality checks: short sentences and long passages."""
    return list(dict.fromkeys(quantize.quality_sentences() + quantize.quality_long_sentences()))


def calibration_texts(data_dir: str | Path | None) -> tuple[list[str], str]:
    """The calibration texts and where they came from: the corpus under `data_dir`, else the built-in set."""
    if data_dir is not None:
        for rel in (CORPUS, WIKI1M, f"corpus/{WIKI1M}"):
            path = Path(data_dir) / rel
            if path.is_file():
                return read_text(path, CORPUS_SENTENCES), rel
    return builtin_sentences(), "built-in"


def ranges(vectors: np.ndarray) -> dict[str, list[list[float]]]:
    """[minima, maxima] per dimension of the normalised vectors at the full dimension and each Matryoshka cut
    below it, keyed by the dimension (float32 values, which JSON keeps exactly)."""
    dim = vectors.shape[1]
    out = {}
    for d in (dim, *sorted((d for d in MATRYOSHKA_DIMENSIONS if d < dim), reverse=True)):
        cut = vectors[:, :d]
        if d < dim:
            cut = cut / np.linalg.norm(cut, axis=1, keepdims=True).clip(min=1e-12)
        cut = cut.astype(np.float32)
        out[str(d)] = [cut.min(axis=0).tolist(), cut.max(axis=0).tolist()]
    return out


def calibrate(export_dir: Path, data_dir: str | Path | None = None) -> dict[str, Any]:
    """The manifest's `calibration` for the export in `export_dir` (its fp32 graph and manifest written)."""
    from service.engine.backends.onnx import OnnxBackend

    texts, source = calibration_texts(data_dir)
    backend = OnnxBackend(export_dir, pad_to_multiple_of=1, verify=False)
    return {"source": source, "sentences": len(texts), "ranges": ranges(backend.encode(texts))}
