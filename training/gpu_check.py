"""`make gpu-check`: is this machine's GPU stack whole? Versions, providers and GPUs seen, then one real pass of
each GPU path: onnxruntime's CUDA provider (and TensorRT's, optional), a FAISS GPU search, a torch training step
on cuda.

Each check prints PASS, FAIL or SKIP with its reason; the exit status is 1 if any failed. Without a GPU the GPU
checks SKIP (a CPU machine is not a broken GPU one); with one, a CPU-only build where a GPU build belongs FAILs.

    python -m training.gpu_check [--model-dir models/<export>]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
#: the distributions that each install one `onnxruntime` / `faiss` package folder: two of one kind overwrite each
#: other's files, and removing either breaks the other
ONNXRUNTIME_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu")
FAISS_DISTRIBUTIONS = ("faiss-cpu", "faiss-gpu-cuvs", "faiss-gpu", "faiss-gpu-cu12", "faiss-gpu-cu13-cuvs")
#: the tiny graph's largest error on a GPU, relative to numpy: the CUDA provider (and TensorRT's) multiplies float32
#: in TF32 on Ampere and later GPUs (10-bit mantissa): ~1e-3
TINY_GRAPH_TOLERANCE = 1e-2


@dataclass
class Result:
    check: str
    status: str
    detail: str

    def line(self) -> str:
        return f"{self.status}  {self.check}: {self.detail}"


def installed(distributions: tuple[str, ...]) -> dict[str, str]:
    """Distribution name → version, for those of `distributions` installed."""
    found = {}
    for name in distributions:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def gpus_seen() -> tuple[list[str], str]:
    """The GPUs this machine has, by nvidia-smi, else by torch; and how that was found out."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            if out.returncode == 0:
                return [line.strip() for line in out.stdout.splitlines() if line.strip()], "nvidia-smi"
            reason = f"nvidia-smi failed: {(out.stderr or out.stdout).strip()[:200]}"
        except (OSError, subprocess.TimeoutExpired) as e:
            reason = f"nvidia-smi failed: {e}"
    else:
        reason = "no nvidia-smi"
    try:
        import torch

        if torch.cuda.is_available():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], "torch"
    except Exception:  # a broken torch is reported by its own check
        pass
    return [], f"{reason}; torch sees none"


def _module_version(name: str) -> str:
    try:
        module = __import__(name)
    except Exception as e:  # ImportError, or a GPU build's missing shared library
        return f"not importable ({type(e).__name__}: {e})"
    return str(getattr(module, "__version__", "?"))


def report_versions(gpus: list[str], how: str) -> list[str]:
    lines = [f"python {platform.python_version()} ({sys.executable})"]
    ort_dists = installed(ONNXRUNTIME_DISTRIBUTIONS)
    lines.append(f"onnxruntime {_module_version('onnxruntime')} "
                 f"(installed as {_dists(ort_dists)})")
    try:
        import onnxruntime as ort

        lines.append(f"onnxruntime providers: {', '.join(ort.get_available_providers())}")
    except Exception:
        pass
    faiss_dists = installed(FAISS_DISTRIBUTIONS)
    lines.append(f"faiss {_module_version('faiss')} (installed as {_dists(faiss_dists)})")
    try:
        import torch

        lines.append(f"torch {torch.__version__} (CUDA build: {torch.version.cuda or 'none, a CPU build'})")
    except Exception as e:
        lines.append(f"torch not importable ({type(e).__name__}: {e})")
    lines.append(f"GPUs seen: {'; '.join(gpus)} ({how})" if gpus else f"GPUs seen: none ({how})")
    return lines


def _dists(found: dict[str, str]) -> str:
    return ", ".join(f"{name} {version}" for name, version in found.items()) or "nothing"


# --- the checks ---------------------------------------------------------------------------------------------------


def check_install() -> Result:
    """One onnxruntime distribution and one faiss distribution: two of a kind share one package folder."""
    problems = []
    for kind, names in (("onnxruntime", ONNXRUNTIME_DISTRIBUTIONS), ("faiss", FAISS_DISTRIBUTIONS)):
        found = installed(names)
        if len(found) > 1:
            problems.append(f"{len(found)} {kind} distributions ({_dists(found)}) write one `{kind}` folder: "
                            f"uninstall all of them, then install the one wanted (make venv-gpu does)")
        elif not found:
            problems.append(f"no {kind} distribution installed")
    if problems:
        return Result("install", FAIL, "; ".join(problems))
    return Result("install", PASS, f"one onnxruntime ({_dists(installed(ONNXRUNTIME_DISTRIBUTIONS))}), "
                  f"one faiss ({_dists(installed(FAISS_DISTRIBUTIONS))})")


def tiny_graph(path: Path) -> None:
    """x [batch, 16] → relu(x·W + b), built with onnx.helper: no export needed to try a provider."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    weight = rng.normal(size=(16, 8)).astype(np.float32)
    bias = rng.normal(size=8).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["z"]),
         helper.make_node("Relu", ["z"], ["y"])],
        "gpu_check",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor("W", TensorProto.FLOAT, weight.shape, weight.ravel().tolist()),
         helper.make_tensor("b", TensorProto.FLOAT, bias.shape, bias.tolist())])
    # IR 8 (opset 17): any onnxruntime this project pins reads it, whatever onnx wrote by default
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def run_tiny_graph(provider: str) -> tuple[str, float]:
    """Run `tiny_graph` on `provider`; the provider that really ran it and its max |error| against numpy, relative
    to the largest output."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.onnx"
        tiny_graph(path)
        weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
        # onnxruntime falls back to the CPU, with only a logged error, when a provider fails to load
        session = ort.InferenceSession(str(path), providers=[provider])
        x = np.random.default_rng(1).normal(size=(4, 16)).astype(np.float32)
        (got,) = session.run(None, {"x": x})
    expected = np.maximum(x @ weights["W"] + weights["b"], 0)
    return session.get_providers()[0], float(np.abs(got - expected).max() / np.abs(expected).max())


def check_onnxruntime_cuda(gpus: list[str], model_dir: Path | None = None) -> Result:
    name = "onnxruntime CUDA"
    import onnxruntime as ort

    available = ort.get_available_providers()
    if not gpus:
        return Result(name, SKIP, "no GPU on this machine")
    if "CUDAExecutionProvider" not in available:
        return Result(name, FAIL, f"a GPU is here but onnxruntime {ort.__version__} offers only {available}: "
                      "the CPU build is installed (make venv-gpu installs onnxruntime-gpu alone)")
    ran, error = run_tiny_graph("CUDAExecutionProvider")
    if ran != "CUDAExecutionProvider":
        return Result(name, FAIL, f"the CUDA provider did not load (the session fell back to {ran}): its CUDA or "
                      "cuDNN libraries are missing or of another CUDA major; onnxruntime's log above says which")
    if not error < TINY_GRAPH_TOLERANCE:
        return Result(name, FAIL, f"a MatMul+Add+Relu graph on CUDA is {error:.2e} off numpy (relative)")
    detail = f"a MatMul+Add+Relu graph ran on CUDA, max error {error:.1e} relative to numpy"
    if model_dir is not None:
        detail += "; " + _export_on_cuda(model_dir)
    return Result(name, PASS, detail)


def check_onnxruntime_tensorrt(gpus: list[str]) -> Result:
    """TensorRT is optional (SEMBED_TENSORRT): where its provider cannot run, a SKIP that says why, never a FAIL.
    onnxruntime-gpu lists the provider whether or not TensorRT's own libraries are installed."""
    name = "onnxruntime TensorRT"
    import onnxruntime as ort

    if not gpus:
        return Result(name, SKIP, "no GPU on this machine")
    optional = "optional (SEMBED_TENSORRT), not usable here"
    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        return Result(name, SKIP, f"{optional}: onnxruntime {ort.__version__} has no TensorRT provider")
    try:
        ran, error = run_tiny_graph("TensorrtExecutionProvider")
    except Exception as e:
        return Result(name, SKIP, f"{optional}: {type(e).__name__}: {e}")
    if ran != "TensorrtExecutionProvider":
        return Result(name, SKIP, f"{optional}: the session fell back to {ran} (TensorRT's libraries, libnvinfer, "
                      "are not where onnxruntime looks; onnxruntime's log above says which)")
    if not error < TINY_GRAPH_TOLERANCE:
        return Result(name, FAIL, f"a MatMul+Add+Relu graph on TensorRT is {error:.2e} off numpy (relative)")
    return Result(name, PASS, f"a MatMul+Add+Relu graph ran on TensorRT, max error {error:.1e} relative to numpy")


def _export_on_cuda(model_dir: Path) -> str:
    """Every variant of an export on CUDA: golden check, and cosine to fp32 on the CPU (raises on a failure)."""
    from service.engine.backends.onnx import OnnxBackend
    from service.manifest import Manifest

    texts = ["A man is playing a guitar.", "Stocks fell sharply on Monday.", "naïve café déjà-vu"]
    reference = OnnxBackend(model_dir, pad_to_multiple_of=1).encode(texts)
    parts = []
    for variant in Manifest.load(model_dir).variants or {"fp32": {}}:
        backend = OnnxBackend(model_dir, device="cuda", variant=variant)  # raises where CUDA did not load
        backend.self_check()
        cosine = float((backend.encode(texts) * reference).sum(axis=1).min())
        if cosine < 0.99:
            raise RuntimeError(f"{model_dir} {variant} on CUDA: min cosine to fp32 on the CPU {cosine:.4f}")
        parts.append(f"{variant} min cosine {cosine:.4f}")
    return f"{model_dir} on CUDA passed its golden checks ({', '.join(parts)} to fp32 on the CPU)"


def check_faiss_gpu(gpus: list[str]) -> Result:
    name = "FAISS GPU"
    import faiss

    if not gpus:
        return Result(name, SKIP, "no GPU on this machine")
    if not hasattr(faiss, "StandardGpuResources"):
        return Result(name, FAIL, f"a GPU is here but faiss {faiss.__version__} has no GPU support "
                      f"(installed as {_dists(installed(FAISS_DISTRIBUTIONS))}): make venv-gpu installs the GPU wheel")
    if faiss.get_num_gpus() < 1:
        return Result(name, FAIL, "faiss has GPU support but sees no GPU (a CUDA runtime of another major?)")
    dim, k = 64, 5
    rng = np.random.default_rng(2)
    base = rng.normal(size=(2000, dim)).astype(np.float32)
    queries = rng.normal(size=(8, dim)).astype(np.float32)
    res = faiss.StandardGpuResources()
    index = faiss.GpuIndexFlatIP(res, dim)
    index.add(base)
    scores, ids = index.search(queries, k)
    expected = np.argsort(-(queries @ base.T), axis=1)[:, :k]
    if not np.array_equal(ids, expected):
        return Result(name, FAIL, "GpuIndexFlatIP's top 5 differ from numpy's exact inner products")
    return Result(name, PASS, f"GpuIndexFlatIP on GPU 0: exact top {k} of 2000 vectors for 8 queries")


def check_torch_cuda(gpus: list[str]) -> Result:
    name = "torch CUDA step"
    try:
        import torch
    except ImportError:
        return Result(name, SKIP, "torch is not installed (the train extra)")
    if not gpus:
        return Result(name, SKIP, "no GPU on this machine")
    if not torch.cuda.is_available():
        why = "a CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}, finds no GPU"
        return Result(name, FAIL, f"a GPU is here but torch {torch.__version__} is {why}")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(128, 32, device="cuda"), torch.randn(128, 1, device="cuda")
    before = [p.detach().clone() for p in model.parameters()]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_bf16_supported()):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    moved = all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    if not (torch.isfinite(loss).item() and moved):
        return Result(name, FAIL, f"one AdamW step: loss {loss.item()}, every parameter updated: {moved}")
    return Result(name, PASS, f"forward, backward and one AdamW step on {torch.cuda.get_device_name(0)} "
                  f"(torch {torch.__version__}, CUDA {torch.version.cuda}), loss {loss.item():.3f}")


def _guarded(check: str, run: Callable[[], Result]) -> Result:
    """A check that raises is a FAIL with the error, never a crash of the whole report."""
    try:
        return run()
    except Exception as e:
        return Result(check, FAIL, f"{type(e).__name__}: {e}")


def run_checks(model_dir: Path | None = None, gpus: tuple[list[str], str] | None = None,
               out: Callable[[str], Any] = print) -> int:
    gpu_list, how = gpus if gpus is not None else gpus_seen()
    for line in report_versions(gpu_list, how):
        out(line)
    results = [
        _guarded("install", check_install),
        _guarded("onnxruntime CUDA", lambda: check_onnxruntime_cuda(gpu_list, model_dir)),
        _guarded("onnxruntime TensorRT", lambda: check_onnxruntime_tensorrt(gpu_list)),
        _guarded("FAISS GPU", lambda: check_faiss_gpu(gpu_list)),
        _guarded("torch CUDA step", lambda: check_torch_cuda(gpu_list)),
    ]
    for result in results:
        out(result.line())
    failed = [r.check for r in results if r.status == FAIL]
    out(f"gpu-check: {len(failed)} failed ({', '.join(failed)})" if failed else "gpu-check: no failures")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, help="an export to run on CUDA too, every variant "
                        "(golden check, cosine to fp32 on the CPU)")
    args = parser.parse_args(argv)
    return run_checks(args.model_dir)


if __name__ == "__main__":
    sys.exit(main())
