"""Re-embed a stopped service's collections with another export, in this process (an offline tool beside the
service's processes: it loads the export itself, with no engine process and no API):

    python -m service.offline_reembed --index-path data/index --model-dir models/new-export [--collection default]
"""

from __future__ import annotations

import argparse

from service.engine.backends.onnx import OnnxBackend
from service.index.base import ModelStamp
from service.index.local import LocalIndex
from service.index.reembed import reembed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index-path", required=True, help="the stopped service's SEMBED_INDEX_PATH")
    parser.add_argument("--model-dir", required=True, help="the export to embed with")
    parser.add_argument("--name", default=None, help="the model's name in the service (default: the export's)")
    parser.add_argument("--collection", action="append", help="default: every collection stamped by a model")
    parser.add_argument("--variant", default="fp32")
    args = parser.parse_args(argv)

    backend = OnnxBackend(args.model_dir, variant=args.variant)  # with the service stopped: in this process
    backend.self_check()
    index = LocalIndex(args.index_path)
    try:
        stamp = ModelStamp(args.name or backend.info.model, backend.info.graph_sha256)
        names = args.collection or [c.name for c in index.list_collections() if c.model is not None]
        for name in names:
            result = reembed(index, name, stamp, backend.info.dimension, backend.encode)
            print(f"{name}: {result.total} documents re-embedded with {stamp.describe()} (sequence {result.sequence})")
    finally:
        index.close()


if __name__ == "__main__":
    main()
