"""The int8 variant of an export: onnxruntime's transformer fusions, then dynamic int8 quantisation.

Fusions first (attention, LayerNorm, GELU: `onnxruntime.transformers.optimizer`), so the quantiser
sees the fused attention and feed-forward MatMuls; weights are quantised per output channel
(`quantize_dynamic(per_channel=True)`), activations at run time. Its quality is measured against
the fp32 graph the export just verified: cosine on a fixed sentence set, and, given STS-B dev,
the Spearman delta, which refuses the variant past `MAX_STSB_DROP` points.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("sembed.export")

INT8_FILE = "model.int8.onnx"
#: the export keeps no int8 variant that loses more STS-B dev Spearman (× 100) than this
MAX_STSB_DROP = 0.5
QUALITY_SENTENCES = [
    "A man is playing a guitar.", "A woman is slicing an onion.", "Two dogs run across a snowy field.",
    "The stock market fell sharply after the announcement.", "Heavy rain is expected in the north tomorrow.",
    "How do I reset my password?", "The committee approved the budget for next year.",
    "She has been learning to play the violin since she was six years old, and now she performs weekly.",
    "Quantum computers use qubits.", "Hi", "naïve café déjà-vu", "The cat sat on the mat.",
]


class QualityError(RuntimeError):
    pass


def build_int8(fp32_graph: Path, out: Path, num_heads: int, hidden_size: int) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source = fp32_graph
    fused = out.with_suffix(".fused.onnx")
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        optimize_model(str(fp32_graph), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
                       opt_level=1).save_model_to_file(str(fused))
        source = fused
    except Exception as e:  # an architecture the fuser does not know: quantise the plain graph
        log.warning("transformer fusions failed (%s); quantising the unfused graph", e)
    try:
        quantize_dynamic(str(source), str(out), per_channel=True, weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        fused.unlink(missing_ok=True)


def measure(export_dir: Path, variant_file: str, stsb_dev: list[tuple[str, str, float]] | None) -> dict[str, Any]:
    """Cosine of the variant's embeddings to fp32's, and STS-B dev Spearman of both when given pairs."""
    from scipy.stats import spearmanr

    from service.backends.onnx import OnnxBackend

    fp32 = OnnxBackend(export_dir, pad_to_multiple_of=1, verify=False)
    variant = OnnxBackend(export_dir, pad_to_multiple_of=1, verify=False, graph_file=variant_file)
    a, b = fp32.encode(QUALITY_SENTENCES), variant.encode(QUALITY_SENTENCES)
    cosines = (a * b).sum(axis=1)
    quality: dict[str, Any] = {"mean_cosine_to_fp32": round(float(cosines.mean()), 5),
                               "min_cosine_to_fp32": round(float(cosines.min()), 5),
                               "stsb_dev_spearman": None, "stsb_dev_spearman_fp32": None, "stsb_dev_delta": None}
    if stsb_dev:
        gold = [score for _, _, score in stsb_dev]
        scores = {}
        for name, backend in (("fp32", fp32), ("variant", variant)):
            left = backend.encode([s1 for s1, _, _ in stsb_dev])
            right = backend.encode([s2 for _, s2, _ in stsb_dev])
            scores[name] = 100 * float(spearmanr((left * right).sum(axis=1), gold).statistic)
        quality.update(stsb_dev_spearman=round(scores["variant"], 3), stsb_dev_spearman_fp32=round(scores["fp32"], 3),
                       stsb_dev_delta=round(scores["variant"] - scores["fp32"], 3))
    golden = fp32.manifest.golden
    if golden:
        quality["golden_embeddings"] = np.round(variant.encode(golden["sentences"]).astype(np.float64), 7).tolist()
    return quality


def check(quality: dict[str, Any], max_drop: float = MAX_STSB_DROP) -> None:
    delta = quality.get("stsb_dev_delta")
    if delta is not None and delta < -max_drop:
        raise QualityError(f"int8 loses {-delta:.2f} STS-B dev Spearman points (more than {max_drop})")
