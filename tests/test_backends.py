"""What each backend declares for the rest of the service (service/engine/backends/): its tokenizer (the null backend,
served by an engine in this process through the registry, tokenises with the export's own) and the name it serves an
export directory under, which the supervisor starts with (checking the export once) and names its models by."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest

from service import supervisor
from service.api.registry import ModelRegistry
from service.engine.backends import create_backend, served_name
from service.engine.backends.null import NullBackend
from service.engine.core import Engine
from service.settings import Settings
from service.tokenization import Tokenizer


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


@pytest.mark.parametrize("kind", ["null", "fake"])
def test_the_supervisor_names_each_model_as_its_backend_serves_it(kind, null_export, tmp_path):
    plain = tmp_path / "plain-dir"
    plain.mkdir()
    export_dir = null_export if kind == "null" else plain
    expected = "null-minilm" if kind == "null" else "plain-dir"  # the manifest's name; the fake one's directory's
    assert served_name(kind, export_dir) == expected
    assert create_backend(kind, export_dir).info.model == expected  # what the engine will say it serves
    started = supervisor.Supervisor(Settings(backend=kind, model_dir=export_dir))
    try:
        topology, children = started.topology()
    finally:
        shutil.rmtree(started.run_dir)
    assert [m.name for m in topology.models] == [expected]
    assert children[0].title == f"sembed: engine {expected} cpu"


@pytest.mark.parametrize("kind", ["onnx", "null"])
def test_a_backend_that_serves_an_export_refuses_a_directory_without_one_at_start(kind, tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor, "_logging", lambda: None)  # leave the test session's logging alone
    monkeypatch.delenv("SEMBED_MODELS", raising=False)
    monkeypatch.setenv("SEMBED_BACKEND", kind)
    monkeypatch.setenv("SEMBED_MODEL_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as start:
        supervisor.main()
    assert str(start.value) == (f"{tmp_path} is not an export directory (no manifest.json); create one with "
                                "`make export` or set SEMBED_MODEL_DIR")
    with pytest.raises(FileNotFoundError):
        served_name(kind, tmp_path)
