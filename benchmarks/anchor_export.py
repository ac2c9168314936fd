"""The anchor of `make bench-int8`: the int8 graph a user gets from sentence-transformers in one call.

Runs in the anchor's own environment (`.venv/anchor`, benchmarks/anchor-requirements.txt), never in ours:
it imports sentence-transformers' ONNX backend (optimum-onnx), nothing of this repository.

    .venv/anchor/bin/python -m benchmarks.anchor_export --model <ST dir> --config avx512_vnni --out <dir>

writes <dir>/onnx/model.onnx (its fp32 export) and <dir>/onnx/model_<weight type>_<config>.onnx
(model_qint8_avx512_vnni.onnx, model_quint8_avx2.onnx), as the efficiency guide's
`export_dynamic_quantized_onnx_model(model, config, path)` does.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a sentence-transformers directory")
    parser.add_argument("--config", required=True, choices=["arm64", "avx2", "avx512", "avx512_vnni"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    # a copy: the backend writes its ONNX export into the model's folder, which may be an installed package
    shutil.copytree(args.model, args.out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("onnx", "openvino"))
    model = SentenceTransformer(str(args.out), backend="onnx", device="cpu")
    model.save_pretrained(str(args.out))  # the fp32 ONNX graph the backend exported, as onnx/model.onnx
    export_dynamic_quantized_onnx_model(model, args.config, str(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
