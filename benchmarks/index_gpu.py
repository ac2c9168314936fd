"""FAISS on the GPU against the CPU, through the service's own VectorSet (what a collection searches with).

For each index type, the same unit vectors go into a VectorSet with SEMBED_INDEX_GPU's `off` and `auto`:
build time, the wall time of one batched search of all queries (k=10; nprobe 16 for IVF), and how far the
GPU's top 10 overlap the CPU's. Without a FAISS GPU build and a GPU, `auto` searches on the CPU too and the
line says so.

    python -m benchmarks.index_gpu [--n 100000] [--dim 384] [--queries 1000] [--types Flat,IVF512,SQ8,IVF512,PQ48]
"""

from __future__ import annotations

import argparse
import time

import faiss
import numpy as np

from service.index.vectors import VectorSet


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def compare(kind: str, x: np.ndarray, queries: np.ndarray, k: int = 10) -> dict:
    """Build, search and top-k of `kind` on the CPU (off) and as `auto` places it."""
    out: dict = {}
    nprobe = None if kind == "Flat" else 16
    for mode in ("off", "auto"):
        start = time.perf_counter()
        vs = VectorSet(x.shape[1], kind, background=False, gpu_mode=mode)
        vs.append(x)
        vs.build_now()
        build = time.perf_counter() - start
        vs.search(queries[:10], k, nprobe=nprobe)  # first call: GPU kernels and scratch memory
        start = time.perf_counter()
        _, slots = vs.search(queries, k, nprobe=nprobe)
        out[mode] = {"on": "GPU" if vs._gpu_ann is not None else "CPU", "build_s": build,
                     "search_ms": (time.perf_counter() - start) * 1e3, "slots": slots}
        vs.close()
    out["overlap"] = float(np.mean([len(set(a) & set(b)) / k for a, b in
                                    zip(out["off"].pop("slots").tolist(), out["auto"].pop("slots").tolist())]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="vectors")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--types", default="Flat;IVF512,SQ8;IVF512,PQ48", help="index types, ';'-separated")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    x, queries = unit(rng.normal(size=(args.n, args.dim))), unit(rng.normal(size=(args.queries, args.dim)))
    print(f"faiss {faiss.__version__}, GPUs {faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0}, "
          f"{faiss.omp_get_max_threads()} CPU threads; {args.n:,} unit vectors of {args.dim}, {args.queries:,} "
          "queries in one batch, k=10", flush=True)
    for kind in args.types.split(";"):
        r = compare(kind, x, queries)
        for mode in ("off", "auto"):
            print(f"{kind:<14} {mode:<5} on the {r[mode]['on']}: build {r[mode]['build_s']:.2f} s, search "
                  f"{r[mode]['search_ms']:.1f} ms", flush=True)
        print(f"{kind:<14} top-10 overlap, auto against off: {r['overlap']:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
