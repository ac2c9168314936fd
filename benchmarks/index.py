"""`make bench-index`: the vector store (LocalIndex) measured side by side in one run.

  1. acknowledged writes per second with fsync, 4 threads of 1-document upserts, with 1k, 100k, 1M
     documents already indexed: once with snapshots held off, once with the default snapshot
     settings (every 10,000 writes or 300 s), p50/p99 latency;
  2. Flat vs HNSW vs IVF at each size of 100k and up: fill time (batched upserts), build time (until
     the background builder covers every slot), memory (RSS growth, the FAISS structure's serialized
     size, the slot array, and the vectors held in all: slot array + the structure's vectors or codes;
     HNSW holds one copy), queries per second one query at a time and in batches, recall@10 against
     Flat, with a small sweep of efSearch / nprobe;
  3. filtered search matching 50%, 5% and 0.1% of documents: queries per second, recall@10 against
     exact filtered search, whether any result came back short, and the time of a search whose filter
     is new (not in the per-collection cache: the metadata index is evaluated);
  4. compact vectors (issue 41), types with a quantization suffix (`Flat+binary`, `Flat+int8`,
     `HNSW32+int8`, ...): recall@10 of the compact structure + float rescoring against exact float
     search, with an oversample sweep (candidates = k x oversample; 20 is the default), the codes'
     memory against the float vectors' (the searched structure), queries per second;
and prints PASS/FAIL for the issue's targets. Everything runs in this process on LocalIndex (a temp
folder on the real disk, fsync on).

Vectors (`--vectors`): `mixture` (the default: unit vectors from a Gaussian mixture, clusters with a
low-dimensional spread plus isotropic noise, closer to real embeddings than uniform noise), a `.npy`
of real embeddings (documents and held-out queries drawn from its rows; `--embed-corpus` makes one
from a text file with an exported model), or `fit:<file.npy>`: a mixture fitted to real embeddings
(their k-means centres, plus residuals drawn from the covariance of each vector's offset from its
centre), so any size keeps what sign bits and int8 codes are sensitive to: the shared mean direction
of a model's embeddings, their per-dimension scales and correlations, and their clusters. Isotropic
random vectors would make binary quantisation's recall a property of the noise. The fitted mixture is
a pessimistic stand-in at scale: its Gaussian residuals fill each cluster evenly, so as it grows a
query's 10th neighbour scores almost as well as its 100th (real texts keep near neighbours apart from
the rest), and a candidate list from sign bits misses more of the exact top 10 than on real vectors.

    python -m benchmarks.index [--sizes 1000,100000,1000000] [--queries 1000] [--dir /var/tmp]
    python -m benchmarks.index --embed-corpus models/all-MiniLM-L6-v2 data/corpus.txt --embed-out emb.npy
    python -m benchmarks.index --vectors fit:emb.npy --types Flat,Flat+int8,Flat+binary --writes 0

`--filter-cost 200000,1000000` measures only the cost of a new filter (3 metadata fields: an int, a
string, a float), alone and in a k=10 Flat search, and how long the metadata index takes to build
from the documents (what loading a snapshot does). It uses only what the store had before the metadata
index too, so the same command on an older checkout gives the "before" figures.

`--lexical-cost 100000 --lexical-texts FILE` measures only a lexical collection's costs (issue 41): the
lines of FILE (one short text each, repeated with a number appended when there are fewer) written in
batches, then the time to the first lexical search (what a restart pays: the log's replay or a
snapshot's load writes every text again), the latency of a lexical search right after a one-document
write and with no write since the last search (medians over --repeats), on LocalIndex's public API
only, so an older checkout gives the "before" figures too.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import faiss
import numpy as np

from benchmarks import machine
from service.index import CollectionSpec, Document, LocalIndex, SearchParams
from service.index.vectors import DEFAULT_OVERSAMPLE

DIM = 384
K = 10
WRITERS = 4
FILL_BATCH = 10_000
HNSW = "HNSW32"
EF_SWEEP = (64, 128, 256, 512, 1024)  # 128 is the store's default; requests may ask up to MAX_EF_SEARCH
NPROBE_SWEEP = (8, 16, 64)  # 16 is the store's default
FILTERS = (("50%", {"b": {"$lt": 500}}, 0.5), ("5%", {"b": {"$lt": 50}}, 0.05), ("0.1%", {"b": 7}, 0.001))
NAME = "bench"
OVERSAMPLE_SWEEP = (1, 4, 10, 20, 40)  # the store's default (SEMBED_INDEX_OVERSAMPLE) is DEFAULT_OVERSAMPLE
QUANT_TARGETS = {"binary": (0.95, 16), "int8": (0.99, 4)}  # the recall@10 and memory reduction


# --- the machine ---------------------------------------------------------------------------------
def cpu_line() -> str:
    return (f"{machine.cpu_line()}; faiss {faiss.__version__} ({faiss.omp_get_max_threads()} threads); "
            f"numpy {np.__version__}")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def disk_line(folder: Path) -> str:
    fstype = "?"
    try:
        best = ""
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, kind, *_ = line.split()
            if str(folder.resolve()).startswith(mount) and len(mount) > len(best):
                best, fstype = mount, kind
    except OSError:
        pass
    return f"index folders under {folder} ({fstype})"


# --- the data --------------------------------------------------------------------------------------
class Mixture:
    """Unit vectors: a cluster centre, plus a spread inside a `latent`-dimensional subspace (one of
    `groups` random subspaces, by cluster), plus isotropic noise. Centres and subspaces are fixed by
    `seed`, so documents and queries come from the same distribution."""

    def __init__(self, dim: int = DIM, clusters: int = 1000, groups: int = 16, latent: int = 32,
                 spread: float = 0.7, noise: float = 0.25, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.dim, self.clusters, self.spread, self.noise = dim, clusters, spread, noise
        self.centres = _unit(rng.standard_normal((clusters, dim), dtype=np.float32))
        self.bases = rng.standard_normal((groups, latent, dim), dtype=np.float32) / np.sqrt(dim)

    def sample(self, n: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        labels = rng.integers(self.clusters, size=n)
        groups, latent, _ = self.bases.shape
        out = rng.standard_normal((n, self.dim), dtype=np.float32)
        out *= self.noise / np.sqrt(self.dim)
        out += self.centres[labels]
        for g in range(groups):
            rows = np.flatnonzero(labels % groups == g)
            z = rng.standard_normal((len(rows), latent), dtype=np.float32) * (self.spread / np.sqrt(latent))
            out[rows] += z @ self.bases[g]
        return _unit(out)


def _unit(rows: np.ndarray) -> np.ndarray:
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows


class Embedded:
    """Real embeddings from a .npy: `sample` deals out disjoint rows (queries first, then documents), so
    queries are held out; a size above what is left is capped."""

    def __init__(self, path: Path):
        self.rows = _unit(np.load(path).astype(np.float32))
        self.dim = self.rows.shape[1]
        self.order = np.random.default_rng(0).permutation(len(self.rows))
        self.queries = 0

    def sample(self, n: int, seed: int) -> np.ndarray:
        if seed == 2:  # the write-rate vectors: any rows will do
            return self.rows[self.order[:n]]
        start = 0 if seed == 1 else self.queries  # seed 1: the queries; seed 3: the documents
        if seed == 1:
            self.queries = n
        n = min(n, len(self.rows) - start)
        return self.rows[self.order[start: start + n]]


class Fitted:
    """A mixture fitted to real embeddings: k-means centres (drawn by their clusters' sizes) plus an offset
    from the covariance of the real vectors' offsets from their centres, normalised. Any size, with the
    real vectors' shared direction, per-dimension scales, correlations and cluster structure."""

    def __init__(self, path: Path, clusters: int = 1000):
        real = _unit(np.load(path).astype(np.float32))
        self.dim = real.shape[1]
        kmeans = faiss.Kmeans(self.dim, clusters, niter=20, seed=0, spherical=True)
        kmeans.train(real)
        _, assign = kmeans.index.search(real, 1)
        assign = assign[:, 0]
        self.centres = kmeans.centroids.copy()
        self.weights = np.bincount(assign, minlength=clusters) / len(real)
        offsets = real - self.centres[assign]
        self.factor = np.linalg.cholesky(np.cov(offsets, rowvar=False) + 1e-9 * np.eye(self.dim)).astype(np.float32)

    def sample(self, n: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        out = np.empty((n, self.dim), dtype=np.float32)
        for i in range(0, n, 100_000):
            m = min(100_000, n - i)
            labels = rng.choice(len(self.centres), size=m, p=self.weights)
            out[i: i + m] = self.centres[labels] + rng.standard_normal((m, self.dim), dtype=np.float32) @ self.factor.T
        return _unit(out)


def vectors_source(spec: str):
    if spec == "mixture":
        return Mixture()
    if spec.startswith("fit:"):
        return Fitted(Path(spec[4:]))
    return Embedded(Path(spec))


def embed_corpus(model: Path, corpus: Path, out: Path, batch: int = 64, max_tokens: int = 128, pairs: int = 0,
                 variant: str = "fp32") -> None:
    """Every line of `corpus` embedded by an exported model (its ONNX graph pools and normalises), to `out`; then
    `pairs` more texts, each two lines of it joined (a fixed random pairing: real text past the corpus's size, for
    1M real embeddings from a corpus of 135k sentences), embedded by its `variant` graph."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    manifest = json.loads((model / "manifest.json").read_text())
    texts = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng = np.random.default_rng(0)
    firsts, seconds = rng.integers(0, len(texts), pairs), rng.integers(0, len(texts), pairs)
    texts += [f"{texts[a]} {texts[b]}" for a, b in zip(firsts, seconds)]
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.enable_truncation(max_tokens)
    session = ort.InferenceSession(str(model / manifest["variants"][variant]["file"]),
                                   providers=["CPUExecutionProvider"])
    order = np.argsort([len(t) for t in texts])  # similar lengths share a batch: little padding
    result = np.empty((len(texts), manifest["dimension"]), dtype=np.float32)
    start = time.perf_counter()
    for i in range(0, len(texts), batch):
        rows = order[i: i + batch]
        encoded = tokenizer.encode_batch([texts[j] for j in rows])
        ids = np.zeros((len(rows), max(len(e.ids) for e in encoded)), dtype=np.int64)
        mask = np.zeros_like(ids)
        for r, e in enumerate(encoded):
            ids[r, : len(e.ids)], mask[r, : len(e.ids)] = e.ids, 1
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        result[rows] = session.run([manifest["outputs"][0]], {k: feed[k] for k in manifest["inputs"]})[0]
    np.save(out, result)
    print(f"{len(texts):,} texts embedded by {manifest['name']} in {time.perf_counter() - start:.0f} s: {out}")


def exact_top(data: np.ndarray, queries: np.ndarray, k: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Row numbers of the exact top k (numpy, blocks of queries), restricted to `rows` if given."""
    base = data if rows is None else data[rows]
    out = np.empty((len(queries), min(k, len(base))), dtype=np.int64)
    step = max(1, (1 << 26) // max(len(base), 1))
    for i in range(0, len(queries), step):
        scores = queries[i: i + step] @ base.T
        top = np.argpartition(-scores, out.shape[1] - 1, axis=1)[:, : out.shape[1]]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        top = np.take_along_axis(top, order, axis=1)
        out[i: i + step] = top if rows is None else rows[top]
    return out


# --- timing helpers ----------------------------------------------------------------------------------
def recall(found: list[list[str]], truth: list[list[str]]) -> float:
    return float(np.mean([len(set(f) & set(t)) / max(len(t), 1) for f, t in zip(found, truth)]))


def ids_of(hits) -> list[str]:
    return [h.id for h in hits]


def single_queries(index, queries: np.ndarray, params: SearchParams, budget_s: float) -> tuple[float, list]:
    """(queries/s one at a time, the results of those run): until all ran or `budget_s` passed (at least 3)."""
    index.search(NAME, queries[:1], params)  # warm-up
    results = []
    start = time.perf_counter()
    for q in queries:
        results.append(ids_of(index.search(NAME, q[None], params)[0]))
        if time.perf_counter() - start > budget_s and len(results) >= 3:
            break
    return len(results) / (time.perf_counter() - start), results


def batch_queries(index, queries: np.ndarray, params: SearchParams, batch: int) -> tuple[float, list]:
    results = []
    start = time.perf_counter()
    for i in range(0, len(queries), batch):
        results.extend(ids_of(h) for h in index.search(NAME, queries[i: i + batch], params))
    return len(queries) / (time.perf_counter() - start), results


def write_rate(index: LocalIndex, vectors: np.ndarray, tag: str) -> dict:
    """4 threads, each upserting one new document per call and waiting for its acknowledgement."""
    latencies: list[list[float]] = [[] for _ in range(WRITERS)]
    per = len(vectors) // WRITERS

    def writer(t: int) -> None:
        for i in range(t * per, (t + 1) * per):
            start = time.perf_counter()
            index.upsert(NAME, [Document(f"{tag}{i}", "", {"b": i % 1000})], vectors[i: i + 1])
            latencies[t].append(time.perf_counter() - start)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(WRITERS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    flat = [x for lat in latencies for x in lat]
    q = statistics.quantiles(flat, n=100, method="inclusive")
    return {"writes": len(flat), "rate": len(flat) / elapsed, "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000}


# --- one collection: fill, build, measure --------------------------------------------------------------
def ivf_spec(n: int, cap: int) -> str:
    nlist = 1 << max(4, int(np.log2(4 * np.sqrt(n))))  # ~4·√n lists, a power of two
    return f"IVF{min(nlist, cap)},SQ8"


def fill(index: LocalIndex, data: np.ndarray, b: np.ndarray) -> float:
    start = time.perf_counter()
    for i in range(0, len(data), FILL_BATCH):
        docs = [Document(f"d{j}", "", {"b": int(b[j])}) for j in range(i, min(i + FILL_BATCH, len(data)))]
        index.upsert(NAME, docs, data[i: i + len(docs)])
    return time.perf_counter() - start


def wait_built(index: LocalIndex, timeout_s: float) -> tuple[bool, float]:
    """(covered everything, share covered) once the builder covers every slot, or at the timeout."""
    vs = index._collections[NAME].vectors
    if not vs._structured:
        return True, 1.0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if vs._ann is not None and vs._covered >= vs.n:
            return True, 1.0
        time.sleep(0.1)
    return False, vs._covered / max(vs.n, 1)


def structure_mb(index: LocalIndex, folder: Path) -> float:
    vs = index._collections[NAME].vectors
    if vs._ann is None:
        return 0.0
    path = folder / "structure.faiss"
    with vs._ann_lock:
        if isinstance(vs._ann, faiss.IndexBinary):
            faiss.write_index_binary(vs._ann, str(path))
        else:
            faiss.write_index(vs._ann, str(path))
    size = path.stat().st_size / 2**20
    path.unlink()
    return size


def measure_type(index_type: str, data, b, queries, truth, filter_truth, args, folder: Path,
                 write_vectors: np.ndarray | None) -> dict:
    row: dict = {"type": index_type, "n": len(data)}
    index_type, _, quantization = index_type.partition("+")
    path = Path(tempfile.mkdtemp(prefix=f"bench-index-{len(data)}-", dir=folder))
    rss0 = rss_mb()
    # Snapshots held off while filling and measuring search (fill batches are ops too); the write
    # rate is measured both ways below.
    index = LocalIndex(path, fsync=True, snapshot_every_ops=10**12, snapshot_every_s=1e12)
    try:
        index.create_collection(CollectionSpec(NAME, data.shape[1], index_type, quantization=quantization or "none"))
        start = time.perf_counter()
        row["fill_s"] = fill(index, data, b)
        built, share = wait_built(index, args.build_timeout)
        row["build_s"] = time.perf_counter() - start  # first write until the builder covers every slot
        row["built"], row["covered"] = built, share
        row["rss_mb"] = rss_mb() - rss0
        row["structure_mb"] = structure_mb(index, path)
        held = index._collections[NAME].vectors.memory()
        row["slots_mb"] = held["slots"] / 2**20  # the slot array (HNSW: only what the structure lacks)
        row["vectors_mb"] = (held["slots"] + held["structure_vectors"]) / 2**20  # every copy of the vectors
        if quantization:  # the searched structure's vectors: codes, against the float vectors they stand for
            row["codes_mb"] = held["structure_vectors"] / 2**20
            row["graph_ids_mb"] = held["structure_other"] / 2**20
            row["smaller"] = data.nbytes / max(held["structure_vectors"], 1)
            print(f"  {row['type']}: codes {row['codes_mb']:.1f} MB ({row['smaller']:.0f}x smaller than the "
                  f"{data.nbytes / 2**20:.0f} MB of float vectors), graph and ids {row['graph_ids_mb']:.1f} MB",
                  flush=True)
        print(f"  {row['type']}: filled in {row['fill_s']:.1f} s, built {'in' if built else 'NOT within'} "
              f"{row['build_s']:.1f} s ({share:.0%} covered), RSS +{row['rss_mb']:.0f} MB, "
              f"structure {row['structure_mb']:.0f} MB, slot array {row['slots_mb']:.0f} MB, vectors held "
              f"{row['vectors_mb']:.0f} MB ({len(data) * DIM * 4 / 2**20:.0f} MB per copy)", flush=True)
        if queries is not None:
            row["search"] = search_rows(index, row["type"], queries, truth, args)
            row["filtered"] = filtered_rows(index, queries, filter_truth, args)
        if write_vectors is not None:
            row["writes"] = measure_writes(index, write_vectors)
    finally:
        index.close()
        shutil.rmtree(path, ignore_errors=True)
    return row


def search_rows(index, index_type, queries, truth, args) -> list[dict]:
    if "+" in index_type:  # quantized: the oversample sweep (HNSW at its default efSearch, or more)
        settings = [(f"os={o}", SearchParams(k=K, oversample=o, with_text=False, with_metadata=False))
                    for o in OVERSAMPLE_SWEEP]
    elif index_type.startswith("HNSW"):
        settings = [(f"ef={ef}", SearchParams(k=K, ef_search=ef, with_text=False, with_metadata=False))
                    for ef in EF_SWEEP]
    elif index_type.startswith("IVF"):
        nlist = int(index_type[3:].split(",")[0])
        settings = [(f"nprobe={p}", SearchParams(k=K, nprobe=p, with_text=False, with_metadata=False))
                    for p in NPROBE_SWEEP if p <= nlist]
    else:
        settings = [("exact", SearchParams(k=K, with_text=False, with_metadata=False))]
    rows = []
    for label, params in settings:
        batch_qps, found = batch_queries(index, queries, params, args.batch)
        single_qps, _ = single_queries(index, queries, params, args.budget)
        r = {"setting": label, "single_qps": single_qps, "batch_qps": batch_qps,
             "recall": recall(found, truth) if truth is not None else 1.0, "found": found}
        print(f"    {label:<11} {single_qps:>9.1f} q/s single {batch_qps:>9.1f} q/s batched  "
              f"recall@10 {r['recall']:.4f}", flush=True)
        rows.append(r)
    return rows


def uncached_ms(index, queries: np.ndarray, params: SearchParams, repeats: int = 5) -> float:
    """Median ms of a single-query search whose filter is not cached (the cache is emptied before each)."""
    collection = index._collections[NAME]
    times = []
    for q in queries[:repeats]:
        collection._filter_cache.clear()
        start = time.perf_counter()
        index.search(NAME, q[None], params)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def filtered_rows(index, queries, filter_truth, args) -> list[dict]:
    rows = []
    for label, spec, _ in FILTERS:
        params = SearchParams(k=K, filter=spec, with_text=False, with_metadata=False)
        new_ms = uncached_ms(index, queries, params)
        qps, found = single_queries(index, queries[: args.filter_queries], params, args.budget)
        truth = filter_truth[label][: len(found)]
        short = sum(len(f) < len(t) for f, t in zip(found, truth))
        rows.append({"filter": label, "qps": qps, "recall": recall(found, truth), "short": short,
                     "queries": len(found), "new_filter_ms": new_ms})
        print(f"    filter {label:<5} {qps:>9.1f} q/s single  recall@10 {rows[-1]['recall']:.4f}  "
              f"short {short}/{len(found)}  new filter {new_ms:.1f} ms", flush=True)
    return rows


# --- the cost of a new filter ----------------------------------------------------------------------
COST_FILTERS = (  # (label, filter) on b: int 0-999, lang: 20 strings, score: float in [0, 1)
    ("string equality, 5%", {"lang": "l7"}),
    ("int range, 50%", {"b": {"$lt": 500}}),
    ("float range, 10%", {"score": {"$gte": 0.9}}),
    ("int equality, 0.1%", {"b": 7}),
    ("$in and range, 1%", {"lang": {"$in": ["l1", "l2"]}, "b": {"$lt": 100}}),
    ("$or of $ne and ranges, 53%", {"$or": [{"lang": {"$ne": "l0"}, "b": {"$gte": 500}}, {"score": {"$lt": 0.05}}]}),
)


def filter_cost(n: int, dim: int, repeats: int) -> dict:
    rng = np.random.default_rng(5)
    b = rng.integers(1000, size=n).tolist()
    lang = rng.integers(20, size=n).tolist()
    score = rng.random(n).tolist()
    docs = [Document(f"d{i}", "", {"b": b[i], "lang": f"l{lang[i]}", "score": score[i]}) for i in range(n)]
    vectors = _unit(rng.standard_normal((n, dim), dtype=np.float32))
    index = LocalIndex(None, snapshot_every_ops=10**12, snapshot_every_s=1e12)  # memory only: no log
    out: dict = {"n": n, "dim": dim, "filters": {}}
    try:
        index.create_collection(CollectionSpec(NAME, dim, "Flat"))
        start = time.perf_counter()
        for i in range(0, n, FILL_BATCH):
            index.upsert(NAME, docs[i: i + FILL_BATCH], vectors[i: i + FILL_BATCH])
        out["fill_s"] = time.perf_counter() - start
        collection = index._collections[NAME]
        print(f"  {n:,} documents ({dim}-d vectors) filled in {out['fill_s']:.1f} s", flush=True)
        try:  # what loading a snapshot costs the metadata index: rebuilt from the documents
            from service.index.metadata import MetadataIndex

            start = time.perf_counter()
            rebuilt = MetadataIndex()
            rebuilt.add(0, [d.metadata for d in docs], np.ones(n, bool))
            out["metadata_build_s"] = time.perf_counter() - start
            out["metadata_mb"] = rebuilt.nbytes() / 2**20
            print(f"  metadata index built from the {n:,} documents in {out['metadata_build_s']:.2f} s "
                  f"({out['metadata_mb']:.0f} MB of columns)", flush=True)
            del rebuilt
        except ImportError:
            print("  (no metadata index in this checkout: filters are evaluated in Python per document)")
        query = vectors[:1]
        for label, spec in COST_FILTERS:
            alone, search = [], []
            for _ in range(repeats):
                collection._filter_cache.clear()
                start = time.perf_counter()
                allowed = collection._allowed(spec)
                alone.append(time.perf_counter() - start)
                collection._filter_cache.clear()
                start = time.perf_counter()
                index.search(NAME, query, SearchParams(k=K, filter=spec, with_text=False, with_metadata=False))
                search.append(time.perf_counter() - start)
            start = time.perf_counter()
            index.search(NAME, query, SearchParams(k=K, filter=spec, with_text=False, with_metadata=False))
            cached = time.perf_counter() - start
            row = {"matching": len(allowed) / n, "filter_ms": statistics.median(alone) * 1000,
                   "search_ms": statistics.median(search) * 1000, "cached_search_ms": cached * 1000}
            out["filters"][label] = row
            print(f"  {label:<28} {row['matching']:>6.1%}  new filter {row['filter_ms']:>9.1f} ms  "
                  f"search with it {row['search_ms']:>9.1f} ms  (cached filter: {row['cached_search_ms']:.1f} ms)",
                  flush=True)
    finally:
        index.close()
    return out


def lexical_cost(n: int, texts_file: Path, repeats: int) -> dict:
    """A lexical collection of n texts: fill, first search (the build from scratch), search after a write, search."""
    lines = [line.strip() for line in texts_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [lines[i % len(lines)] + ("" if i < len(lines) else f" {i // len(lines)}") for i in range(n)]
    rng = np.random.default_rng(6)
    words = [w for w in " ".join(lines[:2000]).lower().split() if len(w) > 3 and w.isalpha()]
    queries = [" ".join(rng.choice(words, 3)) for _ in range(repeats * 2)]
    dim = 8  # the vectors are not what is measured
    vectors = _unit(rng.standard_normal((n + repeats, dim), dtype=np.float32))
    index = LocalIndex(None, snapshot_every_ops=10**12, snapshot_every_s=1e12)  # memory only: no log
    out: dict = {"n": n, "texts": str(texts_file)}
    try:
        index.create_collection(CollectionSpec(NAME, dim, "Flat", lexical=True))
        start = time.perf_counter()
        for i in range(0, n, FILL_BATCH):
            index.upsert(NAME, [Document(f"d{j}", texts[j]) for j in range(i, min(i + FILL_BATCH, n))],
                         vectors[i: i + FILL_BATCH])
        out["fill_s"] = time.perf_counter() - start

        def search(query: str) -> float:
            start = time.perf_counter()
            index.search(NAME, None, SearchParams(k=K, mode="lexical", texts=[query], with_text=False,
                                                  with_metadata=False))
            return time.perf_counter() - start

        out["first_search_s"] = search(queries[0])
        after_write, idle = [], []
        for r in range(repeats):
            index.upsert(NAME, [Document(f"w{r}", lines[r % len(lines)] + " written now")], vectors[n + r: n + r + 1])
            after_write.append(search(queries[2 * r]))
            idle.append(search(queries[2 * r + 1]))
        out["after_write_ms"] = statistics.median(after_write) * 1000
        out["after_write_max_ms"] = max(after_write) * 1000
        out["idle_ms"] = statistics.median(idle) * 1000
        print(f"  {n:,} texts: filled in {out['fill_s']:.1f} s; first lexical search {out['first_search_s']:.2f} s "
              f"(from scratch: {out['fill_s'] + out['first_search_s']:.1f} s in all); search right after a "
              f"1-document write {out['after_write_ms']:.1f} ms (median of {repeats}, max "
              f"{out['after_write_max_ms']:.1f} ms); with no write since {out['idle_ms']:.2f} ms", flush=True)
    finally:
        index.close()
    return out


def measure_writes(index: LocalIndex, vectors: np.ndarray) -> dict:
    half = len(vectors) // 3
    deferred = write_rate(index, vectors[:half], "wa")
    index.snapshot_every_ops, index.snapshot_every_s = 10_000, 300.0  # LocalIndex's defaults
    default = write_rate(index, vectors[half:], "wb")
    print(f"  writes: {deferred['rate']:.0f}/s snapshots held off (p50 {deferred['p50_ms']:.1f} ms, p99 "
          f"{deferred['p99_ms']:.1f} ms); {default['rate']:.0f}/s default snapshots (p50 {default['p50_ms']:.1f} ms, "
          f"p99 {default['p99_ms']:.1f} ms)", flush=True)
    return {"deferred": deferred, "default": default}


# --- the run ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,100000,1000000",
                        help="documents already indexed, comma-separated; search is compared at sizes >= --search-min")
    parser.add_argument("--search-min", type=int, default=10_000, help="smallest size with the search comparison")
    parser.add_argument("--types", default=f"Flat,{HNSW},IVF",
                        help="index types compared (IVF: IVF<~4·sqrt(n)>,SQ8, capped by --ivf-max-lists)")
    parser.add_argument("--hnsw-max", type=int, default=0,
                        help="largest size with an HNSW row (0: every size); HNSW32 builds ~1k vectors/s on 2 cores")
    parser.add_argument("--ivf-max-lists", type=int, default=2048,
                        help="cap on IVF lists (k-means training cost grows with lists × sample)")
    parser.add_argument("--queries", type=int, default=1000, help="queries (recall is averaged over all of them)")
    parser.add_argument("--batch", type=int, default=100, help="queries per batched search call")
    parser.add_argument("--filter-queries", type=int, default=200, help="queries per filter")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds per single-query measurement at most")
    parser.add_argument("--writes", type=int, default=30_000,
                        help="1-document writes per size: a third with snapshots held off, the rest with the defaults")
    parser.add_argument("--build-timeout", type=float, default=1800.0, help="seconds to wait for a background build")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="where the index folders go (a real disk)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here as JSON")
    parser.add_argument("--report", type=Path, default=None, help="print the tables of an earlier --out JSON")
    parser.add_argument("--filter-cost", default=None,
                        help="only measure a new filter's cost at these sizes (comma-separated), then exit")
    parser.add_argument("--filter-dim", type=int, default=DIM, help="vector dimension for --filter-cost")
    parser.add_argument("--lexical-cost", default=None,
                        help="only measure a lexical collection's build and search costs at these sizes, then exit")
    parser.add_argument("--lexical-texts", type=Path, default=None, help="one text per line, for --lexical-cost")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timings per filter (--filter-cost) or per search (--lexical-cost); medians")
    parser.add_argument("--vectors", default="mixture",
                        help="mixture, a .npy of real embeddings, or fit:<.npy> (a mixture fitted to them)")
    parser.add_argument("--embed-corpus", nargs=2, type=Path, metavar=("MODEL", "TEXTS"), default=None,
                        help="only embed each line of TEXTS with the exported MODEL into --embed-out, then exit")
    parser.add_argument("--embed-out", type=Path, default=Path("embeddings.npy"), help="where --embed-corpus writes")
    parser.add_argument("--embed-pairs", type=int, default=0,
                        help="--embed-corpus: this many more texts, each two lines of TEXTS joined")
    parser.add_argument("--embed-variant", default="fp32", help="--embed-corpus: the export's variant (int8: faster)")
    args = parser.parse_args(argv)
    if args.embed_corpus:
        embed_corpus(*args.embed_corpus, args.embed_out, batch=256 if args.embed_pairs else 64,
                     pairs=args.embed_pairs, variant=args.embed_variant)
        return 0
    if args.filter_cost:
        print(cpu_line(), flush=True)
        results = {"cpu": cpu_line(), "filter_cost": []}
        for n in (int(x) for x in args.filter_cost.split(",")):
            results["filter_cost"].append(filter_cost(n, args.filter_dim, args.repeats))
        if args.out:
            args.out.write_text(json.dumps(results, indent=2) + "\n")
        return 0
    if args.lexical_cost:
        if args.lexical_texts is None:
            parser.error("--lexical-cost needs --lexical-texts (one text per line)")
        print(cpu_line(), flush=True)
        results = {"cpu": cpu_line(), "lexical_cost": [lexical_cost(int(x), args.lexical_texts, args.repeats)
                                                       for x in args.lexical_cost.split(",")]}
        if args.out:
            args.out.write_text(json.dumps(results, indent=2) + "\n")
        return 0
    if args.report:
        results = json.loads(args.report.read_text())
        results["sizes"] = {int(n): rows for n, rows in results["sizes"].items()}
        print(results["cpu"])
        args.out = None
        return report(results, sorted(results["sizes"]), args)
    sizes = [int(s) for s in args.sizes.split(",")]
    types = [t.strip() for t in args.types.split(",")]

    print(cpu_line(), flush=True)
    mixture = vectors_source(args.vectors)
    print(f"{disk_line(args.dir)}; vectors {args.vectors} ({mixture.dim}-d); k {K}; {args.queries} queries; "
          f"writes: {WRITERS} threads of 1-document upserts with fsync\n", flush=True)
    queries = mixture.sample(args.queries, seed=1)
    write_vectors = mixture.sample(args.writes, seed=2) if args.writes else None
    results: dict = {"cpu": cpu_line(), "sizes": {}}
    for n in sizes:
        print(f"== {n:,} documents", flush=True)
        data = mixture.sample(n, seed=3)
        if len(data) < n:
            print(f"  only {len(data):,} vectors in {args.vectors}", flush=True)
            n = len(data)
        b = np.random.default_rng(4).integers(1000, size=n)
        searching = n >= args.search_min
        truth = filter_truth = None
        if searching:
            t0 = time.perf_counter()
            truth = [[f"d{j}" for j in row] for row in exact_top(data, queries, K)]
            filter_truth = {}
            for label, _, share in FILTERS:
                allowed = np.flatnonzero(b < 500) if share == 0.5 else np.flatnonzero(b < 50) if share == 0.05 \
                    else np.flatnonzero(b == 7)
                top = exact_top(data, queries[: args.filter_queries], K, allowed)
                filter_truth[label] = [[f"d{j}" for j in row] for row in top]
            print(f"  exact truth (numpy) in {time.perf_counter() - t0:.1f} s", flush=True)
        rows = []
        for t in (types if searching else ["Flat"]):
            if t.startswith("HNSW") and args.hnsw_max and n > args.hnsw_max:
                print(f"  {t}: skipped at {n:,} (--hnsw-max {args.hnsw_max:,})", flush=True)
                continue
            spec = ivf_spec(n, args.ivf_max_lists) if t == "IVF" else t
            rows.append(measure_type(spec, data, b, queries if searching else None, truth, filter_truth, args,
                                     args.dir, write_vectors if spec == "Flat" else None))
        if searching and rows[0]["type"] == "Flat":  # recall against Flat's own answers, as the issue asks
            flat_found = rows[0]["search"][0]["found"]
            for r in rows:
                for s in r["search"]:
                    s["recall_vs_flat"] = recall(s["found"], flat_found)
        for r in rows:
            for s in r.get("search", []):
                s.pop("found", None)
        results["sizes"][n] = rows
        del data
    return report(results, sorted(results["sizes"]), args)  # a size a .npy capped is reported as run


def _mb(row: dict, key: str) -> str:
    """A memory figure of the slot array / vectors held; '-' for a report from before they were measured."""
    return f"{row[key]:>7.0f}MB" if "vectors_mb" in row else f"{'-':>9}"


def report(results: dict, sizes: list[int], args) -> int:
    print(f"\n{'acknowledged writes (fsync)':<30}{'indexed':>10}{'writes/s':>10}{'p50':>9}{'p99':>9}"
          f"{'writes/s':>12}{'p50':>9}{'p99':>9}")
    print(f"{'':<40}{'-- snapshots held off --':>28}{'-- default snapshots --':>30}")
    rates = {}
    for n in sizes:
        w = next((r["writes"] for r in results["sizes"][n] if "writes" in r), None)
        if w is None:
            continue
        a, d = w["deferred"], w["default"]
        rates[n] = (a["rate"], d["rate"])
        print(f"{'4 writers, 1 doc each':<30}{n:>10,}{a['rate']:>10.0f}{a['p50_ms']:>7.1f}ms{a['p99_ms']:>7.1f}ms"
              f"{d['rate']:>12.0f}{d['p50_ms']:>7.1f}ms{d['p99_ms']:>7.1f}ms")
    print(f"\n{'search':<22}{'n':>10}{'setting':>12}{'q/s 1':>9}{'q/s batch':>11}{'recall@10':>11}"
          f"{'fill':>8}{'build':>9}{'RSS +':>9}{'FAISS':>9}{'slots':>9}{'vectors':>9}")
    for n in sizes:
        for r in results["sizes"][n]:
            for s in r.get("search", []):
                build = f"{r['build_s']:.0f}s" if r["built"] else f">{r['build_s']:.0f}s"
                print(f"{r['type']:<22}{n:>10,}{s['setting']:>12}{s['single_qps']:>9.1f}{s['batch_qps']:>11.1f}"
                      f"{s.get('recall_vs_flat', s['recall']):>11.4f}{r['fill_s']:>7.0f}s{build:>9}"
                      f"{r['rss_mb']:>7.0f}MB{r['structure_mb']:>7.0f}MB{_mb(r, 'slots_mb')}{_mb(r, 'vectors_mb')}")
    quantized = [(n, r) for n in sizes for r in results["sizes"][n] if "codes_mb" in r]
    if quantized:
        print(f"\n{'compact vectors':<22}{'n':>10}{'setting':>12}{'q/s 1':>9}{'q/s batch':>11}{'recall@10':>11}"
              f"{'codes':>10}{'smaller':>9}{'graph+ids':>11}")
        for n, r in quantized:
            for s in r["search"]:
                print(f"{r['type']:<22}{n:>10,}{s['setting']:>12}{s['single_qps']:>9.1f}{s['batch_qps']:>11.1f}"
                      f"{s.get('recall_vs_flat', s['recall']):>11.4f}{r['codes_mb']:>8.1f}MB{r['smaller']:>8.0f}x"
                      f"{r['graph_ids_mb']:>9.1f}MB")
    print(f"\n{'filtered search':<22}{'n':>10}{'matching':>10}{'q/s 1':>9}{'recall@10':>11}{'short':>9}"
          f"{'new filter':>12}")
    for n in sizes:
        for r in results["sizes"][n]:
            for f in r.get("filtered", []):
                new = f"{f['new_filter_ms']:.1f}ms" if "new_filter_ms" in f else "-"
                print(f"{r['type']:<22}{n:>10,}{f['filter']:>10}{f['qps']:>9.1f}{f['recall']:>11.4f}"
                      f"{f['short']:>5}/{f['queries']}{new:>12}")

    print()
    checks = []
    searched = [n for n in sizes if n >= args.search_min]
    with_hnsw = [n for n in searched if {"Flat", HNSW} <= {r["type"] for r in results["sizes"][n]}]
    if searched and (not with_hnsw or with_hnsw[-1] != searched[-1]):
        print(f"n/a   {HNSW} targets at {searched[-1]:,}: no {HNSW} row there (--hnsw-max)")
    if with_hnsw:
        top = with_hnsw[-1]
        rows = {r["type"]: r for r in results["sizes"][top]}
        flat, hnsw = rows["Flat"], rows[HNSW]
        base = flat["search"][0]
        for s in hnsw["search"]:
            if s["setting"] == "ef=128":
                ratio = s["single_qps"] / base["single_qps"]
                checks.append((f"{HNSW} recall@10 ≥ 0.95 at {top:,} (ef=128 default: {s['recall_vs_flat']:.4f})",
                               s["recall_vs_flat"] >= 0.95))
                checks.append((f"{HNSW} ≥ 10× Flat's queries/s at {top:,}, single queries ({ratio:.1f}×)",
                               ratio >= 10))
                bratio = s["batch_qps"] / base["batch_qps"]
                checks.append((f"{HNSW} ≥ 10× Flat's queries/s at {top:,}, batches of {args.batch} "
                               f"({bratio:.1f}×)", bratio >= 10))
        reach = [s for s in hnsw["search"] if s["recall_vs_flat"] >= 0.95]
        if reach:  # efSearch is a per-request setting: the cheapest one that reaches the recall target
            s = reach[0]
            ratio = s["single_qps"] / base["single_qps"]
            checks.append((f"{HNSW} at {top:,} with {s['setting']} (per request): recall@10 {s['recall_vs_flat']:.4f} "
                           f"≥ 0.95 at ≥ 10× Flat's queries/s ({ratio:.1f}× single)", ratio >= 10))
        else:
            checks.append((f"{HNSW} recall@10 ≥ 0.95 at {top:,} with some efSearch of {EF_SWEEP}", False))
        if not hnsw["built"]:
            checks.append((f"{HNSW} at {top:,} built within {args.build_timeout:.0f} s "
                           f"({hnsw['covered']:.0%} covered)", False))
    if quantized:  # the targets, at the largest size with each quantization, default oversample
        for q, (target, smaller) in QUANT_TARGETS.items():
            rows = [(n, r) for n, r in quantized if r["type"].endswith("+" + q)]
            if not rows:
                continue
            top = max(n for n, _ in rows)
            for n, r in rows:
                s = next(s for s in r["search"] if s["setting"] == f"os={DEFAULT_OVERSAMPLE}")
                got = s.get("recall_vs_flat", s["recall"])
                if n == top:
                    checks.append((f"{r['type']} at {n:,}: recall@10 {got:.4f} >= {target} of exact float with the "
                                   f"default oversample, codes {r['smaller']:.0f}x smaller >= {smaller}x",
                                   got >= target and r["smaller"] >= smaller))
    for n in searched:
        for r in results["sizes"][n]:
            for f in r.get("filtered", []):
                if f["short"]:
                    checks.append((f"{r['type']} {n:,} filter {f['filter']}: no short results ({f['short']} short)",
                                   False))
    if len(rates) >= 2:
        lo, hi = min(rates), max(rates)
        for i, label in ((0, "snapshots held off"), (1, "default snapshots")):
            ratio = rates[lo][i] / rates[hi][i]
            checks.append((f"write rate at {hi:,} within 2× of the rate at {lo:,}, {label} "
                           f"({rates[hi][i]:.0f}/s vs {rates[lo][i]:.0f}/s: {ratio:.2f}×)", ratio <= 2))
    return machine.finish(checks, results, args.out)


if __name__ == "__main__":
    sys.exit(main())
