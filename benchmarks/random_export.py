"""An export with a real model's architecture and tokenizer but random weights, for timing on a machine that holds
no copy of the weights (the lent GPU machines reach no registry and carry 64 MiB a call): the graph's speed
depends on its shapes, not its values. Its vectors mean nothing; its parity and fp16 checks run as for any export.

    python -m benchmarks.random_export <sentence-transformers dir> <out export dir>

The model directory needs only the small files (config.json, tokenizer files, modules.json, 1_Pooling/...);
its weights, if there, are not read.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def random_export(model_dir: Path, out: Path) -> dict:
    import torch
    from transformers import AutoConfig, AutoModel

    from core.encoder import SentenceEncoder
    from export.exporter import export_onnx

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="sembed-random-") as tmp:
        hf = Path(tmp)
        for item in model_dir.iterdir():
            if item.name not in WEIGHT_FILES and item.name != "config.json":
                (shutil.copytree if item.is_dir() else shutil.copy)(item, hf / item.name)
        AutoModel.from_config(AutoConfig.from_pretrained(model_dir), add_pooling_layer=False).save_pretrained(hf)
        manifest = export_onnx(SentenceEncoder.from_pretrained(hf), out, name=f"{model_dir.name}-random-weights",
                               int8=False)
    return {"variants": list(manifest.variants or {}), "left_out": manifest.variants_left_out,
            "parity_max_abs_diff": manifest.parity_max_abs_diff}


if __name__ == "__main__":
    print(random_export(Path(sys.argv[1]), Path(sys.argv[2])))
