"""manifest.json: what an export directory holds. Written by export, read by the service."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_FILE = "manifest.json"
GRAPH_FILE = "model.onnx"
#: 2: `variants` (each graph with its sha256 and measured quality) and `golden`; 3: `prompts` and
#: `default_prompt_name`, which the service applies (a service that ignored them would serve other vectors
#: than the model's authors intended, so an older one refuses it). Older manifests still load, but for the
#: retired layouts `StaleExport` names.
FORMAT_VERSION = 3
#: what the graph computes: sentence embeddings, or one relevance score per (query, text) pair
EMBEDDING, CROSS_ENCODER, CLASSIFIER, SPARSE = "embedding", "cross-encoder", "classifier", "sparse"
SCORE_OUTPUT = "score"  # a cross-encoder graph's one output, [batch]; a classifier's, [batch, labels]
SPARSE_OUTPUT = "sparse"  # a SPLADE graph's one output: [batch, vocabulary], mostly zeros
#: an embedding graph's third output: the transformer's last hidden state, [batch, sequence, hidden] (TEI's
#: /embed_all); onnxruntime computes only the outputs a run asks for, so /embed's passes never copy it out
TOKEN_OUTPUT = "token_embeddings"
#: the variant name of the retired per-CPU int8 pair's row-scaled graph (`Manifest.retired_layout`)
RETIRED_INT8 = "int8-avx2"


class Manifest(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())

    format_version: int = FORMAT_VERSION
    name: str = Field(description="export name, reported by the service as `model`")
    base_model: str
    method: str | None = Field(None, description="training objective, None for a plain export")
    kind: str = Field(EMBEDDING, description=f"{EMBEDDING!r} (served at /embed, ...), {CROSS_ENCODER!r} "
                      "(a pair scorer, served at /rerank only; `dimension` is 1, the score), "
                      f"{CLASSIFIER!r} (a sequence classifier, served at /predict; `dimension` is its labels) or "
                      f"{SPARSE!r} (a SPLADE model, served at /embed_sparse; `dimension` is its vocabulary size)")
    pooling: str
    dimension: int
    max_seq_length: int
    opset: int
    pad_token: str
    pad_token_id: int
    inputs: list[str] = Field(description="graph inputs in order, e.g. input_ids, attention_mask, token_type_ids")
    outputs: list[str]
    onnx_sha256: str
    created_at: str
    parity_max_abs_diff: float | None = None
    batch_invariant: bool = Field(False, description="pooling gives the same bits for a batch of one row as "
                                  "for a larger batch: every export writes true; an export without it is refused "
                                  "(`StaleExport`)")
    variants: dict[str, dict[str, Any]] | None = Field(None, description="graph files by variant (fp32, int8, "
                                                       "fp16): file, sha256, measured quality against fp32")
    golden: dict[str, Any] | None = Field(None, description="fixed sentences and their embeddings at export, "
                                          "checked again before the service reports ready")
    training: dict[str, Any] | None = None
    prompts: dict[str, str] = Field(default_factory=dict, description="sentence-transformers' prompts by name "
                                    "(e.g. query: 'query: '): text the service puts before an input")
    default_prompt_name: str | None = Field(None, description="the prompt applied where a request names none")
    family: str | None = Field(None, description="the model family the export was built as (core/families)")
    id2label: dict[str, str] | None = Field(None, description="a classifier's label of each output, by index")
    multi_label: bool = Field(False, description="a classifier's labels are independent (sigmoid each), not "
                              "exclusive (softmax over them): transformers' problem_type multi_label_classification")
    calibration: dict[str, Any] | None = Field(
        None, description="an embedding model's per-dimension ranges for int8 / uint8 output (sentence-transformers' "
        "quantize_embeddings): `ranges` maps a dimension (the full one and Matryoshka cuts) to [minima, maxima] of "
        "the normalised vectors of `sentences` texts from `source` (export/calibration.py); absent in exports "
        "made before it, which serve no int8 / uint8 (an older service ignores it: no vector changes)")
    score_activation: Literal["Sigmoid", "Identity", "Tanh"] = Field(
        "Sigmoid", description="a cross-encoder's: what turns its logit into the score /rerank answers "
        "(sentence-transformers' CrossEncoder activation_fn)")

    token_dimension: int = Field(0, description=f"the hidden size of the graph's {TOKEN_OUTPUT!r} output (every "
                                 "token's last hidden state, TEI's /embed_all); 0: exported before it, or none")
    max_active_dims: int | None = Field(None, description="a sparse model's: the most non-zero dimensions a "
                                        "vector keeps (its largest values), as SparseEncoder.encode keeps by default")
    splade: dict[str, str] | None = Field(None, description="a sparse model's SpladePooling: pooling_strategy "
                                          "(max, sum) and activation_function (relu, log1p_relu), inside the graph")

    @classmethod
    def load(cls, export_dir: str | Path) -> Manifest:
        path = Path(export_dir) / MANIFEST_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: is {export_dir} an export directory?")
        manifest = cls.model_validate_json(path.read_text())
        if manifest.format_version > FORMAT_VERSION:
            raise ValueError(f"{path} is manifest format {manifest.format_version}; this service reads up to "
                             f"{FORMAT_VERSION}: upgrade the service, or re-export with this version")
        if reason := manifest.retired_layout():
            raise StaleExport(f"{path}: {reason}, a layout this service no longer reads: export again: "
                              f"{manifest.export_command(export_dir)}")
        return manifest

    def retired_layout(self) -> str | None:
        """Why this export is in a layout the service no longer serves, None if it is not. Each was written for a
        day or two: an export without `batch_invariant` pooled a batch of one row differently from a larger one
        (the service padded such a batch with a row); one naming "int8-avx2" (as a variant or as one left out)
        has the by-blocks int8 graph (MatMulNBits, whose kernels compute differently per instruction set) that
        the one row-scaled int8 graph replaced."""
        if RETIRED_INT8 in (self.variants or {}) or RETIRED_INT8 in (getattr(self, "variants_left_out", None) or {}):
            return f"its int8 graphs are the retired pair (int8 by blocks beside {RETIRED_INT8})"
        if not self.batch_invariant:
            return "it was exported before batch-invariant pooling (no batch_invariant)"
        return None

    def export_command(self, export_dir: str | Path) -> str:
        """The command that writes this export again (a trained model's from its run's best/ directory)."""
        model = "<the run's best/ directory>" if self.method else self.base_model
        return f"python -m export --model {model} --out {export_dir}"

    def save(self, export_dir: str | Path) -> None:
        (Path(export_dir) / MANIFEST_FILE).write_text(self.model_dump_json(indent=2) + "\n")


class StaleExport(ValueError):
    """An export in a retired layout (`Manifest.retired_layout`): the message names its manifest and the command
    that exports it again."""


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
