"""The model directory Infinity's ONNX engine serves, as the hub's copy of all-MiniLM-L6-v2 gives it: the
sentence-transformers files and optimum's ONNX export of the transformer (output `last_hidden_state`).

Runs in `make bench-peers`' own environment (.venv/peers: infinity-emb, optimum-onnx), never in ours:

    .venv/peers/bin/python -m benchmarks.peers_prepare <sentence-transformers dir> <out dir> <hf home>

Two steps stand in for what infinity-emb 0.0.78 cannot do with the optimum it installs today:
- it hands optimum the ONNX file's path as it found it, and optimum 2 matches that against the bare file
  name: so the graph lies at the directory's top as `model.onnx`, and Infinity starts in that directory with
  `--model-id .` (benchmarks/peers.py);
- its graph optimisation (optimum's ORTOptimizer, level 99, CPU, fp32) passes a keyword optimum 2 dropped and
  falls back to the unoptimised graph: the same optimisation is run here, with optimum 2's spelling of the
  same config, into the folder where Infinity looks for a graph it optimised before, and it loads that one.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def prepare(st_dir: Path, out: Path, hf_home: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for item in st_dir.iterdir():  # the sentence-transformers files, linked
        link = out / item.name
        if not link.exists() and item.name != "onnx":
            link.symlink_to(item.resolve())
    if not (out / "model.onnx").is_file():
        main_export = peers_module("optimum.exporters.onnx").main_export
        export = out / "optimum-export"
        # library "transformers": the bare transformer (last_hidden_state), as the hub's onnx/model.onnx is;
        # optimum would otherwise export a sentence-transformers directory with its pooling inside
        main_export(str(st_dir), export, task="feature-extraction", library_name="transformers")
        (export / "model.onnx").rename(out / "model.onnx")
    ort = peers_module("optimum.onnxruntime")
    config = peers_module("optimum.onnxruntime.configuration").OptimizationConfig(
        optimization_level=99, enable_transformers_specific_optimizations=True, optimize_for_gpu=False, fp16=False)

    # infinity_emb.transformer.utils_optimum.optimize_model's folder for model id "." on the CPU provider, under
    # the hub cache of Infinity's HF_HOME (peers.py sets it, and no HF_HUB_CACHE)
    folder = hf_home / "hub" / "infinity_onnx" / "CPUExecutionProvider" / "."
    if list(folder.glob("**/*_optimized.onnx")):
        return
    model = ort.ORTModelForFeatureExtraction.from_pretrained(out, file_name="model.onnx")
    ort.ORTOptimizer.from_pretrained(model).optimize(optimization_config=config, save_dir=folder.as_posix(),
                                                     one_external_file=True)


def peers_module(name: str):
    """A module of the peers' environment (optimum), which ours does not install (deptry checks ours)."""
    return importlib.import_module(name)


if __name__ == "__main__":
    prepare(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
