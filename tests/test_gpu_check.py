"""`make gpu-check` (training/gpu_check.py) on this CPU machine: versions printed, the GPU checks SKIP (no crash,
exit 0); and what it says when a GPU is there but the stack is wrong (simulated: the real GPU paths need one)."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import faiss
import onnxruntime as ort
import pytest
import torch

from training import gpu_check

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None or torch.cuda.is_available(), reason="a GPU is here")
def test_on_a_cpu_machine_the_gpu_checks_skip_and_the_versions_print():
    run = subprocess.run([sys.executable, "-m", "training.gpu_check"], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert f"onnxruntime {ort.__version__} (installed as onnxruntime {ort.__version__})" in out
    assert f"onnxruntime providers: {', '.join(ort.get_available_providers())}" in out
    assert f"faiss {faiss.__version__} (installed as faiss-cpu" in out
    assert f"torch {torch.__version__} (CUDA build: " in out
    assert "GPUs seen: none (" in out
    lines = out.splitlines()
    for check in ("onnxruntime CUDA", "onnxruntime TensorRT", "FAISS GPU", "torch CUDA step"):
        assert f"SKIP  {check}: no GPU on this machine" in lines
    assert any(line.startswith("PASS  install: one onnxruntime (onnxruntime ") for line in lines)
    assert lines[-1] == "gpu-check: no failures" and "Traceback" not in run.stderr


def test_the_tiny_graph_runs_and_matches_numpy_on_the_cpu_provider():
    ran, error = gpu_check.run_tiny_graph("CPUExecutionProvider")
    assert ran == "CPUExecutionProvider" and error < 1e-5


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers() or torch.version.cuda is not None,
                    reason="GPU builds are installed here")
def test_a_gpu_with_cpu_builds_installed_fails_each_check_with_why():
    lines: list[str] = []
    status = gpu_check.run_checks(gpus=(["NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB"], "nvidia-smi"),
                                  out=lines.append)
    assert status == 1
    assert "GPUs seen: NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB (nvidia-smi)" in lines
    by_check = {line.split(":")[0]: line for line in lines if line[:4] in ("PASS", "FAIL", "SKIP")}
    assert by_check["FAIL  onnxruntime CUDA"].endswith(
        "the CPU build is installed (make venv-gpu installs onnxruntime-gpu alone)")
    assert "has no GPU support (installed as faiss-cpu" in by_check["FAIL  FAISS GPU"]
    assert "is a CPU build" in by_check["FAIL  torch CUDA step"]
    assert by_check["SKIP  onnxruntime TensorRT"].endswith(f"onnxruntime {ort.__version__} has no TensorRT provider")
    assert lines[-1] == "gpu-check: 3 failed (onnxruntime CUDA, FAISS GPU, torch CUDA step)"


@pytest.mark.skipif("TensorrtExecutionProvider" in ort.get_available_providers(), reason="TensorRT's provider is here")
def test_tensorrt_listed_but_not_loadable_is_a_skip_that_says_why(monkeypatch):
    """onnxruntime-gpu lists TensorRT's provider without its libraries (as on the GPU machines lent so far); the
    real session here cannot run it either, and the optional check says so without failing the report."""
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.warns(UserWarning, match="TensorrtExecutionProvider"):  # onnxruntime's own word: dropped
        result = gpu_check.check_onnxruntime_tensorrt(["NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB"])
    assert result.status == gpu_check.SKIP and result.detail.startswith("optional (SEMBED_TENSORRT), not usable here: ")


def test_two_onnxruntime_distributions_fail_the_install_check(monkeypatch):
    versions = {"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.31.1", "faiss-cpu": "1.15.1"}

    def version(name: str) -> str:
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    result = gpu_check.check_install()
    assert result.status == gpu_check.FAIL
    assert result.detail.startswith("2 onnxruntime distributions (onnxruntime 1.31.1, onnxruntime-gpu 1.31.1) "
                                    "write one `onnxruntime` folder")
    versions.pop("onnxruntime")
    assert gpu_check.check_install().status == gpu_check.PASS


def test_a_check_that_raises_is_a_fail_not_a_crash(monkeypatch):
    def broken(gpus):
        raise OSError("libcudnn.so.9: cannot open shared object file")

    monkeypatch.setattr(gpu_check, "check_faiss_gpu", broken)
    lines: list[str] = []
    assert gpu_check.run_checks(gpus=([], "test"), out=lines.append) == 1
    assert "FAIL  FAISS GPU: OSError: libcudnn.so.9: cannot open shared object file" in lines
    assert "SKIP  onnxruntime CUDA: no GPU on this machine" in lines
