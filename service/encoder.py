"""The encoder behind the service: tokenizers + onnxruntime over an export directory, no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from service.manifest import GRAPH_FILE, Manifest, sha256_file


@dataclass
class Embeddings:
    normalized: np.ndarray  # [n, dim] float32, unit rows
    raw: np.ndarray  # [n, dim] float32, as pooled
    tokens: int  # non-padding tokens processed, for metrics


class Encoder(Protocol):
    manifest: Manifest

    @property
    def dim(self) -> int: ...

    def embed(self, texts: list[str]) -> Embeddings: ...


class IntegrityError(RuntimeError):
    pass


class OnnxEncoder:
    """Runs model.onnx on one padded batch; the graph already pools and normalises."""

    def __init__(self, export_dir: str | Path, intra_op_threads: int = 0, verify: bool = True):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        export_dir = Path(export_dir)
        self.manifest = Manifest.load(export_dir)
        graph = export_dir / GRAPH_FILE
        if verify:
            digest = sha256_file(graph)
            if digest != self.manifest.onnx_sha256:
                raise IntegrityError(f"{graph} sha256 {digest} does not match manifest {self.manifest.onnx_sha256}")

        self.tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=self.manifest.max_seq_length)
        self.tokenizer.enable_padding(pad_id=self.manifest.pad_token_id, pad_token=self.manifest.pad_token)

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if intra_op_threads:
            options.intra_op_num_threads = intra_op_threads
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
        self.session = ort.InferenceSession(str(graph), options, providers=providers)

    @property
    def dim(self) -> int:
        return self.manifest.dimension

    def embed(self, texts: list[str]) -> Embeddings:
        encodings = self.tokenizer.encode_batch(texts)
        feeds = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        }
        if "token_type_ids" in self.manifest.inputs:
            feeds["token_type_ids"] = np.array([e.type_ids for e in encodings], dtype=np.int64)
        normalized, raw = self.session.run(["embedding", "embedding_raw"], feeds)
        return Embeddings(normalized, raw, int(feeds["attention_mask"].sum()))

    def encode(self, texts: list[str], normalize: bool = True, batch_size: int = 64) -> np.ndarray:
        """Embed any number of texts in length-sorted batches (in-process use: evaluation, tests)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            result = self.embed([texts[i] for i in idx])
            out[idx] = result.normalized if normalize else result.raw
        return out
