"""python -m export --model <HF or sentence-transformers dir, hub name, or default> --out models/<name>"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.cross_encoder import CrossEncoder, PairScorer, is_cross_encoder_dir, sequence_classifier_head
from core.default_model import model_label, resolve_model
from core.encoder import SentenceEncoder
from core.pooling import POOLINGS
from core.sparse import SpladeEncoder, is_sparse_encoder_dir
from export.exporter import export_onnx
from export.sparse import export_sparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="HF/sentence-transformers dir or hub name; "
                        "'default' = the embedded all-MiniLM-L6-v2 (sha256-verified)")
    parser.add_argument("--out", required=True, type=Path, help="export directory to write")
    parser.add_argument("--pooling", choices=POOLINGS, help="override the model's own pooling config")
    parser.add_argument("--max-seq-length", type=int, help="override the model's own max length")
    parser.add_argument("--name", help="name the service reports (default: the --out folder name)")
    parser.add_argument("--no-int8", action="store_true", help="write no int8 variant")
    parser.add_argument("--no-fp16", action="store_true", help="write no fp16 variant")
    parser.add_argument("--data-dir", type=Path, help="a data folder holding STS-B (as for training): the "
                        "variants' STS-B dev Spearman is measured and checked; and its unlabelled corpus "
                        "(corpus/wordnet-sentences.txt): int8 / uint8 output is calibrated on it")
    parser.add_argument("--trust-remote-code", action="store_true", help="run the model's own modelling code "
                        "from its directory or the hub (NomicBERT, JinaBERT, GTE): only for a model you trust; the "
                        "parity check still guards the graph")
    args = parser.parse_args(argv)

    model_dir = resolve_model(args.model)
    splade: SpladeEncoder | None = None
    try:
        if is_sparse_encoder_dir(model_dir):  # a SparseEncoder (SPLADE): served at /embed_sparse
            splade = SpladeEncoder.from_pretrained(model_dir, args.max_seq_length, args.trust_remote_code)
        elif is_cross_encoder_dir(model_dir):  # a cosent-cross run's best/: exports as a pair scorer
            encoder = CrossEncoder.from_pretrained(model_dir)
            encoder.max_seq_length = args.max_seq_length or encoder.max_seq_length
        elif sequence_classifier_head(model_dir):
            # a reranker: scored as CrossEncoder.predict scores, never exported as its bare encoder's mean
            encoder = PairScorer.from_pretrained(model_dir, args.max_seq_length, args.trust_remote_code)
        else:
            encoder = SentenceEncoder.from_pretrained(model_dir, args.pooling, args.max_seq_length,
                                                      trust_remote_code=args.trust_remote_code)
            encoder.base_model = model_label(args.model)  # not a site-packages path for the default
    except ValueError as e:  # a model or option the export cannot reproduce: nothing is written
        print(f"export refused: {e}", file=sys.stderr)
        return 2
    if splade is not None:
        manifest = export_sparse(splade, args.out, name=args.name)
        print(f"exported {manifest.base_model} → {args.out} (sparse: vocabulary {manifest.dimension}, SpladePooling "
              f"{manifest.splade}, max_active_dims {manifest.max_active_dims}, "
              f"max_seq_length {manifest.max_seq_length}, parity {manifest.parity_max_abs_diff:.1e})")
        print(f"serve it with: MODEL_DIR={args.out} make serve")
        return 0
    manifest = export_onnx(encoder, args.out, name=args.name, int8=not args.no_int8, fp16=not args.no_fp16,
                           data_dir=args.data_dir)
    print(f"exported {manifest.base_model} → {args.out} (dim {manifest.dimension}, pooling {manifest.pooling}, "
          f"normalize {getattr(encoder, 'normalize', 'n/a')}, "
          f"max_seq_length {manifest.max_seq_length}, parity {manifest.parity_max_abs_diff:.1e})")
    for variant, entry in (manifest.variants or {}).items():
        if "quality" in entry:
            q = entry["quality"]
            delta = "n/a (no --data-dir)" if q["stsb_dev_delta"] is None else f"{q['stsb_dev_delta']:+.2f}"
            kept = len((entry.get("search") or {}).get("float_matmuls", []))
            print(f"  {variant}: mean cosine to fp32 {q['mean_cosine_to_fp32']:.4f} (short sentences), "
                  f"{q['mean_cosine_to_fp32_long']:.4f} (long passages), STS-B dev Spearman {delta}"
                  f" (measured on {q['measured_on']})" + (f"; {kept} MatMuls kept in float32" if kept else ""))
    for variant, reason in (getattr(manifest, "variants_left_out", None) or {}).items():
        print(f"  {variant}: left out ({reason})")
    if manifest.calibration:
        print(f"  int8 / uint8 output: ranges from {manifest.calibration['sentences']} sentences "
              f"({manifest.calibration['source']}) at dimensions {', '.join(manifest.calibration['ranges'])}")
    print(f"serve it with: MODEL_DIR={args.out} make serve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
