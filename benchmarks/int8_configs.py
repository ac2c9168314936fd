"""int8 quantisation settings compared: mean (and minimum) cosine to fp32 on the benchmark's texts.

Each setting quantises the export's fused fp32 graph (`export.quantize.fuse`) with `quantize_dynamic`
and embeds 256 short (10-14 tokens) and 256 long (124-132 tokens) texts, built as `make bench` builds
them, in length-sorted batches of 32 and of 256, each padded to its longest text. Cosines only: no
timing (the bench measures speed). RESULTS.md (its int8 section) cites what this printed for the shipped
recipe; the tables of every setting tried are in its history (git show a7c93d5:RESULTS.md).

    python -m benchmarks.int8_configs --model-dir models/all-MiniLM-L6-v2 --data-dir ../shared/data [--exact] [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from benchmarks.serving import make_texts
from export.quantize import EXACT_INT8_KERNEL, ffn_outputs, fuse, row_scaled

BATCHES = (32, 256)


def _layer_nodes(graph, kind: str) -> list[str]:
    """The fused graph's nodes of one kind, in layer order: qkv (Attention), attn_out, ffn_in, ffn_out."""
    shapes = {init.name: list(init.dims) for init in graph.initializer}
    if kind == "qkv":
        return [n.name for n in graph.node if n.op_type == "Attention"]
    if kind == "ffn_out":  # the very nodes build_int8 row-scales
        return ffn_outputs(graph)
    dense = [n for n in graph.node if n.op_type == "MatMul" and len(shapes.get(n.input[1], [])) == 2]
    test = {"attn_out": lambda k, n: k == n, "ffn_in": lambda k, n: k < n}[kind]
    return [n.name for n in dense if test(*shapes[n.input[1]])]


#: name → quantize_dynamic options; "exclude" names (kind, layers) resolved on the fused graph
CONFIGS: dict[str, dict] = {
    "default (main before this change)": {},
    "MatMul only (no QAttention, no QEmbedLayerNormalization)": {"op_types_to_quantize": ["MatMul"]},
    "MatMul + Attention (no QEmbedLayerNormalization)": {"op_types_to_quantize": ["MatMul", "Attention"]},
    "MatMul + EmbedLayerNormalization (no QAttention)": {"op_types_to_quantize": ["MatMul", "EmbedLayerNormalization"]},
    "reduce_range": {"reduce_range": True},
    "QUInt8 weights": {"weight_type": "QUInt8"},
    "per-tensor weights": {"per_channel": False},
    "ActivationSymmetric": {"extra_options": {"ActivationSymmetric": True}},
    "WeightSymmetric=False": {"extra_options": {"WeightSymmetric": False}},
    "unfused graph (Q, K, V as 3 MatMulInteger)": {"fuse": False},
    "fp32: EmbedLayerNormalization": {"exclude": [("embed", [0])]},
    "fp32: Attention (QKV) of layer 0": {"exclude": [("qkv", [0])]},
    "fp32: all 6 attention outputs": {"exclude": [("attn_out", range(6))]},
    "fp32: all 6 FFN inputs": {"exclude": [("ffn_in", range(6))]},
    "fp32: all 6 FFN outputs": {"exclude": [("ffn_out", range(6))]},
    **{f"fp32: layer {i} (QKV, attention output, FFN in and out)": {
        "exclude": [("qkv", [i]), ("attn_out", [i]), ("ffn_in", [i]), ("ffn_out", [i])]} for i in range(6)},
    **{f"fp32: FFN output of layer {i}": {"exclude": [("ffn_out", [i])]} for i in range(6)},
    "fp32: FFN outputs of layers 0, 1": {"exclude": [("ffn_out", [0, 1])]},
    "fp32: FFN outputs of layers 0, 2 (build_int8 before issue 26)": {"exclude": [("ffn_out", [0, 2])]},
    "fp32: FFN outputs of layers 0, 1, 2": {"exclude": [("ffn_out", [0, 1, 2])]},
    # every MatMul int8, some inputs scaled per row first (export.quantize.row_scaled); 7-bit weights as shipped
    **{f"7-bit, rows: {what}": {"reduce_range": True, "rows": rows} for what, rows in (
        ("FFN outputs of layers 0, 2", [("ffn_out", [0, 2])]),
        ("FFN outputs of layers 0, 1, 2 (the shipped int8)", [("ffn_out", [0, 1, 2])]),
        ("all 6 FFN outputs", [("ffn_out", range(6))]),
        ("all 6 FFN inputs and outputs", [("ffn_out", range(6)), ("ffn_in", range(6))]),
        ("every dense MatMul", [("ffn_out", range(6)), ("ffn_in", range(6)), ("attn_out", range(6))]))},
}


def build(name: str, fused: Path, plain: Path, out: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    options = dict(CONFIGS[name])
    source = fused if options.pop("fuse", True) else plain
    model = onnx.load(str(source))
    graph = model.graph

    def nodes_of(choice: list[tuple[str, Iterable[int]]]) -> list[str]:
        named = []
        for kind, layers in choice:
            nodes = [n.name for n in graph.node if n.op_type == "EmbedLayerNormalization"] if kind == "embed" else \
                _layer_nodes(graph, kind)
            named += [nodes[i] for i in layers if i < len(nodes)]  # a shallower model than the default's: its own
        return named

    exclude = nodes_of(options.pop("exclude", []))
    row_scaled(model, set(nodes_of(options.pop("rows", []))))
    extra = {"DefaultTensorType": onnx.TensorProto.FLOAT, **options.pop("extra_options", {})}
    weight_type = getattr(QuantType, options.pop("weight_type", "QInt8"))
    quantize_dynamic(model, str(out), per_channel=options.pop("per_channel", True), weight_type=weight_type,
                     nodes_to_exclude=exclude, extra_options=extra, **options)


def encoder(path: Path, tokenizer, exact: bool = False):
    """`exact`: onnxruntime's non-saturating uint8 x int8 kernel on x86 CPUs without VNNI (the vectors a VNNI
    CPU computes; a no-op on one)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if exact:
        options.add_session_config_entry(EXACT_INT8_KERNEL, "1")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def encode(texts: list[str], batch: int) -> np.ndarray:
        encodings = tokenizer.encode_batch(texts)
        order = np.argsort([-len(e.ids) for e in encodings], kind="stable")
        out = np.zeros((len(texts), session.get_outputs()[0].shape[1]), np.float32)
        for start in range(0, len(texts), batch):
            idx = order[start : start + batch]
            width = max(len(encodings[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), np.int64)
            mask = np.zeros_like(ids)
            for row, i in enumerate(idx):
                ids[row, : len(encodings[i].ids)], mask[row, : len(encodings[i].ids)] = encodings[i].ids, 1
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            names = {i.name for i in session.get_inputs()}
            out[idx] = session.run(["embedding"], {k: v for k, v in feeds.items() if k in names})[0]
        return out

    return encode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path("models/all-MiniLM-L6-v2"))
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--num-heads", type=int, default=12, help="the model's attention heads (for the fusions)")
    parser.add_argument("--hidden-size", type=int, help="the model's hidden size (default: the manifest's dimension)")
    parser.add_argument("--graph", type=Path, action="append", default=[], help="also measure this graph file")
    parser.add_argument("--exact", action="store_true", help="int8 products computed exactly on CPUs without VNNI "
                        "too (what a VNNI CPU computes): export.quantize.EXACT_INT8_KERNEL")
    parser.add_argument("names", nargs="*", help="settings to run (default: all, or none when --graph is given)")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the quantiser's pre-processing advice, once per setting

    from tokenizers import Tokenizer

    manifest = json.loads((args.model_dir / "manifest.json").read_text())
    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    texts = dict(zip(("short", "long"), make_texts(tokenizer, args.data_dir, 256, 256)))
    tokenizer.enable_truncation(manifest["max_seq_length"])
    plain = args.model_dir / "model.onnx"
    fp32 = encoder(plain, tokenizer)
    reference = {name: fp32(t, 64) for name, t in texts.items()}
    print("| setting | " + " | ".join(f"{n} b{b}" for n in texts for b in BATCHES) + " |", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        fused = fuse(plain, Path(tmp) / "fused.onnx", args.num_heads, args.hidden_size or manifest["dimension"])
        names = args.names or ([] if args.graph else list(CONFIGS))
        runs = [(name, None) for name in names] + [(str(g), g) for g in args.graph]
        for name, graph in runs:
            if graph is None:
                graph = Path(tmp) / "int8.onnx"
                build(name, fused, plain, graph)
            encode, cells = encoder(graph, tokenizer, args.exact), []
            for set_name, t in texts.items():
                for batch in BATCHES:
                    cosine = (encode(t, batch) * reference[set_name]).sum(axis=1)
                    cells.append(f"{cosine.mean():.4f} ({cosine.min():.3f})")
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
