"""Re-embed a collection from its stored texts with another model, then switch to it in one step.

Used by POST /admin/collections/{name}/reembed, by a model reload with `reembed`, and from the
command line while the service is stopped:

    python -m service.index.reembed --index-path data/index --model-dir models/new-export [--collection default]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from service.index.base import CollectionSpec, Document, InvalidRequest, ModelStamp, VectorIndex, WriteResult

Embed = Callable[[list[str]], np.ndarray]


def reembed(index: VectorIndex, name: str, stamp: ModelStamp, dimension: int, embed: Embed,
            batch: int = 256) -> WriteResult:
    """Rebuild `name` with `embed`'s vectors of every stored text; writes to it are refused meanwhile and
    searches keep the old vectors until the switch."""
    info = index.info(name)
    if info.model is None:
        raise InvalidRequest(f"collection {name!r} holds client vectors, not texts to re-embed")

    def batches():
        for records in index.scan(name, batch):
            texts = [r.text for r in records]
            yield [Document(r.id, r.text, r.metadata) for r in records], embed(texts)

    return index.replace_collection(CollectionSpec(name, dimension, info.index_type, stamp), batches())


def main(argv: list[str] | None = None) -> None:
    from service.engine.backends.onnx import OnnxBackend
    from service.index.local import LocalIndex

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
