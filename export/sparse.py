"""A SPLADE model (a sentence-transformers SparseEncoder directory, core/sparse.py) to a servable export.

The graph holds the whole path, masked-LM head and SpladePooling included: token ids in, each text's
vocabulary-sized SPLADE vector out (output "sparse", [batch, vocabulary]); manifest kind "sparse", `dimension`
the vocabulary size, served at TEI's /embed_sparse. The vector leaves the graph dense: dropping its zeros (TEI's
answer) and keeping the model's `max_active_dims` largest values (SparseEncoder.encode's default) happen in the
API process, from the engine's float vector (docs/sparse.md says why there). Checked against torch on padded
batches of mixed lengths before the manifest is written, as every export is; no int8 or fp16 variant (their
quality gate measures dense embeddings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from core import families
from core.sparse import SpladeEncoder
from export.exporter import (
    GOLDEN_SENTENCES,
    PARITY_SENTENCES,
    PARITY_TOLERANCE,
    ParityError,
    _fix_output_dims,
    _graph_fields,
    _input_names,
    _save_tokenizer,
    _staged,
    _trace,
)
from service.manifest import GRAPH_FILE, SPARSE, SPARSE_OUTPUT, Manifest

#: the golden record keeps each golden sentence's largest values, not its whole vocabulary-sized vector
GOLDEN_TOP = 64


def _feeds(encoder: SpladeEncoder, texts: list[str], padding_side: str | None = None) -> dict[str, torch.Tensor]:
    tokenizer = encoder.tokenizer
    own = tokenizer.padding_side
    tokenizer.padding_side = padding_side or own
    try:
        batch = encoder.tokenize(texts)
    finally:
        tokenizer.padding_side = own
    return {name: batch[name] for name in _input_names(encoder)}


class _SparseGraph(nn.Module):
    def __init__(self, encoder: SpladeEncoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        return self.encoder(input_ids, attention_mask, token_type_ids)


def check_sparse_parity(encoder: SpladeEncoder, onnx_path: Path, texts: list[str] = PARITY_SENTENCES) -> float:
    """Max |onnx − torch| of the SPLADE vectors of one padded batch of mixed lengths: torch on the batch padded as
    the tokenizer pads it, the graph on the batch padded on the right, as the service feeds it."""
    import onnxruntime as ort

    with torch.no_grad():
        expected = _SparseGraph(encoder).eval()(**_feeds(encoder, texts)).numpy()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feeds = {k: v.numpy().astype(np.int64) for k, v in _feeds(encoder, texts, "right").items()}
    (got,) = session.run([SPARSE_OUTPUT], feeds)
    return float(np.abs(got - expected).max())


def golden_record(encoder: SpladeEncoder) -> dict[str, Any]:
    """The golden sentences' `GOLDEN_TOP` largest values and their indices (the service checks them at start)."""
    with torch.no_grad():
        vectors = _SparseGraph(encoder).eval()(**_feeds(encoder, GOLDEN_SENTENCES)).numpy()
    top = np.argsort(-vectors, axis=1, kind="stable")[:, :GOLDEN_TOP]
    return {"sentences": GOLDEN_SENTENCES, "indices": top.tolist(),
            "values": np.round(np.take_along_axis(vectors, top, axis=1).astype(np.float64), 7).tolist(),
            "active": (vectors > 0).sum(axis=1).tolist()}


def export_sparse(encoder: SpladeEncoder, out_dir: str | Path, *, name: str | None = None,
                  tolerance: float = PARITY_TOLERANCE) -> Manifest:
    """Write the export directory atomically: a failed parity check leaves nothing behind."""
    out_dir = Path(out_dir)
    encoder = encoder.to("cpu").eval()
    input_names = _input_names(encoder)
    with _staged(out_dir) as staging:
        graph_path = staging / GRAPH_FILE
        _trace(_SparseGraph(encoder), _feeds(encoder, ["a short one", "a somewhat longer sentence to force padding"]),
               input_names, [SPARSE_OUTPUT], graph_path)
        _fix_output_dims(graph_path, encoder.vocab_size)
        diff = check_sparse_parity(encoder, graph_path)
        if not diff <= tolerance:
            raise ParityError(f"ONNX and torch SPLADE vectors differ by {diff:.2e} (> {tolerance:.0e}); "
                              "export discarded")
        _save_tokenizer(encoder.tokenizer, staging)
        manifest = Manifest(
            **_graph_fields(graph_path, encoder.tokenizer, input_names, [SPARSE_OUTPUT], diff),
            name=name or out_dir.name,
            base_model=encoder.base_model,
            kind=SPARSE,
            pooling="splade",  # TEI's name for it (/info's model_type)
            dimension=encoder.vocab_size,
            max_seq_length=encoder.max_seq_length,
            golden=golden_record(encoder),
            prompts=encoder.prompts,
            default_prompt_name=encoder.default_prompt_name,
            family=families.family_of(encoder.model.config).name,
            max_active_dims=encoder.max_active_dims,
            splade={"pooling_strategy": encoder.pooling_strategy, "activation_function": encoder.activation},
        )
        manifest.variants = {"fp32": {"file": GRAPH_FILE, "sha256": manifest.onnx_sha256}}
        manifest.variants_left_out = {"int8": "not built for sparse models (the quality gate measures dense "
                                              "embeddings)", "fp16": "not built for sparse models"}
        manifest.save(staging)
    return manifest
