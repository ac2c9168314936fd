"""The cost of a collection's sparse (SPLADE) vectors (issue 41): `python -m benchmarks.sparse_index --chunks 100000`.

Fills an in-memory LocalIndex collection with a sparse model's stamp, through its public API (writes of `--batch`
documents, each one chunk), with SPLADE-like rows: about `--active` non-zero dimensions of a 30,522-word vocabulary,
drawn Zipf-weighted (a few dimensions in many rows, as SPLADE's frequent word pieces are); queries hold about
`--query-active`. Prints the time to fill it, the median and 90th percentile of a mode "sparse" search (k 10) with no
write since and right after a one-document write, and, for comparison, one scipy CSR matrix of every row times a
dense query vector (the scan the column-ordered blocks avoid).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp

from service.index import CollectionSpec, Document, LocalIndex, ModelStamp, SearchParams
from service.index.base import SparseRows

VOCABULARY = 30_522
DIM = 8  # the dense vectors beside them: small, this measures the sparse side


def sparse_rows(rng: np.random.Generator, n: int, active: int, weights: np.ndarray, order: np.ndarray) -> SparseRows:
    columns = [np.unique(order[rng.choice(VOCABULARY, size=active, p=weights)]) for _ in range(n)]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum([len(c) for c in columns], out=indptr[1:])
    values = (rng.random(int(indptr[-1])) * 2).astype(np.float32)
    return SparseRows(indptr, np.concatenate(columns).astype(np.int32), values)


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=100_000, help="rows stored")
    parser.add_argument("--batch", type=int, default=100, help="documents per write")
    parser.add_argument("--active", type=int, default=200, help="dimensions drawn per row (fewer once repeats go)")
    parser.add_argument("--query-active", type=int, default=50, help="dimensions drawn per query")
    parser.add_argument("--queries", type=int, default=50)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    weights = 1.0 / np.arange(1, VOCABULARY + 1)
    weights /= weights.sum()
    order = rng.permutation(VOCABULARY)
    index = LocalIndex(background=False)
    index.create_collection(CollectionSpec("c", DIM, sparse_model=ModelStamp("splade", "0" * 64),
                                           sparse_dimension=VOCABULARY))
    vectors = rng.normal(size=(args.batch, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    written, fill = [], 0.0
    for first in range(0, args.chunks, args.batch):
        rows = sparse_rows(rng, args.batch, args.active, weights, order)
        written.append(rows)
        docs = [Document(f"d{first + i}", "") for i in range(args.batch)]
        fill += timed(lambda: index.upsert("c", docs, vectors, rows))  # noqa: B023 - called at once
    queries = [sparse_rows(rng, 1, args.query_active, weights, order) for _ in range(args.queries)]

    def search(query: SparseRows) -> None:
        index.search("c", None, SearchParams(k=10, mode="sparse",
                                             sparse_queries=[(query.indices.tolist(), query.values.tolist())]))

    search(queries[0])
    idle = [timed(lambda: search(q)) for q in queries]  # noqa: B023
    after_write = []
    for i, q in enumerate(queries):
        index.upsert("c", [Document(f"new{i}", "")], vectors[:1], sparse_rows(rng, 1, args.active, weights, order))
        after_write.append(timed(lambda: search(q)))  # noqa: B023
    whole = sp.csr_array(sp.vstack([sp.csr_array((r.values, r.indices, r.indptr), shape=(r.rows, VOCABULARY))
                                    for r in written], format="csr"))
    dense_queries = []
    for q in queries:
        dense = np.zeros(VOCABULARY, np.float32)
        dense[q.indices] = q.values
        dense_queries.append(dense)
    scan = [timed(lambda: whole @ d) for d in dense_queries]  # noqa: B023
    index.close()

    def ms(times: list[float]) -> str:
        return f"median {np.median(times) * 1e3:.1f} ms, p90 {np.percentile(times, 90) * 1e3:.1f} ms"

    print(f"{args.chunks} chunks, {whole.nnz / whole.shape[0]:.0f} non-zeros each on average, queries of "
          f"{np.mean([len(q.indices) for q in queries]):.0f}; filled in {fill:.1f} s (writes of {args.batch})")
    print(f"sparse search, no write since: {ms(idle)}")
    print(f"sparse search after a 1-document write: {ms(after_write)}")
    print(f"one CSR matrix of every row times a dense query: {ms(scan)}")


if __name__ == "__main__":
    main()
