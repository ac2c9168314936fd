"""Model runtimes behind one interface, chosen once by `create_backend`."""

from __future__ import annotations

from pathlib import Path

from service.engine.backends.base import Backend, BackendError, bucketed_rows, padded_length
from service.manifest import Manifest

__all__ = ["Backend", "BackendError", "bucketed_rows", "create_backend", "padded_length", "served_name"]


def served_name(kind: str, export_dir: str | Path) -> str:
    """The model name a backend of `kind` serves `export_dir` under, known before an engine loads it (the supervisor
    names the engine process and the API processes' model with it; the engine's ModelInfo.model is the same):
    the export's manifest's, read and checked here (FileNotFoundError without one, StaleExport in a retired
    layout). The fake backend reads no export: its model is named after the directory."""
    if kind == "fake":
        return Path(export_dir).name or "fake"
    return Manifest.load(export_dir).name


def create_backend(kind: str, export_dir: str | Path, *, device: str = "cpu", intra_op_threads: int = 0,
                   pad_to_multiple_of: int = 0, variant: str = "fp32", spin: bool = False,
                   tensorrt: bool = False, streams: int = 1) -> Backend:
    if kind == "onnx":
        from service.engine.backends.onnx import OnnxBackend

        return OnnxBackend(export_dir, device=device, intra_op_threads=intra_op_threads,
                           pad_to_multiple_of=pad_to_multiple_of, variant=variant, spin=spin, tensorrt=tensorrt,
                           streams=streams)
    if kind == "null":
        from service.engine.backends.null import NullBackend

        return NullBackend(export_dir, pad_to_multiple_of=pad_to_multiple_of or 8)
    if kind == "fake":
        from service.engine.backends.fake import FakeBackend

        return FakeBackend(name=served_name(kind, export_dir), pad_to_multiple_of=pad_to_multiple_of or 8)
    raise ValueError(f"unknown backend {kind!r}: onnx, null or fake")
