"""A collection's vectors: an append-only store of slots, and an ANN structure built beside it.

Every vector lives in a slot of a float32 array that only grows; replacing or deleting a document
kills its slot (a tombstone), so a write costs O(batch) whatever the collection's size. The ANN
structure (a FAISS factory string: HNSW32, IVF1024,SQ8, IVF1024,PQ48) is derived from the slots
by a background builder: it covers slots [0, covered), and search adds an exact pass over the
slots written since. So writes never wait for graph insertion or IVF training; an IVF index that
has too few vectors to train is simply exact until it has enough; and when tombstones pass a
fraction of what the structure covers, it is rebuilt from the live slots and swapped in.
`Flat` has no structure: exact search over the slots, as FAISS's IndexFlatIP does.

Compact vectors (a collection's `quantization`): the searched structure holds int8 codes (FAISS's
SQ8: IndexScalarQuantizer for Flat, IndexHNSWSQ for HNSW<M>) or sign bits (IndexBinaryFlat,
IndexBinaryHNSW, Hamming distance), and its k × oversample best candidates are rescored with the
float vectors of the slot array (kept in memory, or in a memory-mapped file: FloatFile), so returned
scores are exact cosines, ranked as float search would rank those candidates. The slot array then
keeps every slot (the structure holds no float copy). int8 needs per-dimension ranges: they are
trained once, in the writer's thread, by the write that first makes the collection hold
QUANT_TRAIN_ROWS live vectors, from those vectors (min/max with a margin): a function of the logged
writes alone, so replaying the log trains the same ranges, and a snapshot stores them. Until then
search is exact. IVF types already store codes and take no quantization.

Filters arrive as the list of allowed slots. Few of them: exact search over just those. Many: the
ANN structure searches with an ID selector; if that returns fewer hits than exist, exact search
over the allowed slots answers instead, so a filtered search is never silently short.

One copy of each vector. An HNSW structure (IndexHNSWFlat) stores full vectors itself, so the slot
array keeps only what it does not cover yet: once the builder covers slots, they are dropped from the
array (the array restarts at `base`), and a read of a covered slot (exact search over a filter's
slots, a returned vector, a snapshot, a rebuild) gathers it from the structure's storage under
`_ann_lock`, finding its position in the structure's sorted id list. IVF stores compressed codes,
so for IVF (and Flat) the array holds every slot, as before.

On a GPU (gpu.py, SEMBED_INDEX_GPU=auto with faiss-gpu and a GPU present), Flat and IVF keep a GPU
copy for unfiltered search: IVF's structure copied with index_cpu_to_gpu and fed the same chunks, and
for Flat an exact IndexFlatIP on the GPU whose positions are slots, built by the same builder thread.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from service.index import gpu
from service.index.base import InvalidRequest

_HNSW = re.compile(r"^HNSW(\d{1,3})$")
_IVF = re.compile(r"^IVF(\d{1,6}),(SQ8|PQ(\d{1,3})(?:x(\d))?)$")
MAX_EF_SEARCH = 4096
DEFAULT_EF_SEARCH = 128
DEFAULT_NPROBE = 16
EXACT_BELOW = 20_000  # allowed slots up to this many: exact search over them beats a selector walk
REBUILD_FRACTION = 0.2  # rebuild the structure once this share of what it covers is dead
BUILD_CHUNK = 2048  # rows added to the structure per lock hold, so searches interleave
EXACT_BLOCK = 65_536  # slots scored per block in exact search (bounds the gathered copy)
MIN_ROWS = 256  # rows the slot array keeps room for after HNSW trims it
TRIM_MIN = BUILD_CHUNK  # HNSW trims the slot array once the structure holds this many of its rows
QUANTIZATIONS = ("none", "int8", "binary")
QUANT_TRAIN_ROWS = 1000  # int8: live vectors a collection holds when its ranges are trained (exact until then)
QUANT_TRAIN_MAX = 65_536  # int8: at most this many of them (evenly spread over the slots) train the ranges
QUANT_RANGE_MARGIN = 0.1  # int8: each dimension's trained [min, max] widened by this share of it on each side
DEFAULT_OVERSAMPLE = 20  # quantized: candidates rescored per hit asked for (SEMBED_INDEX_OVERSAMPLE)
MAX_OVERSAMPLE = 100
MAX_CANDIDATES = 20_000  # quantized: candidates taken from the structure per query at most (when k asks more)


@dataclass(frozen=True)
class IndexType:
    spec: str
    kind: str  # flat | hnsw | ivf
    hnsw_m: int = 0
    nlist: int = 0
    pq_m: int = 0
    pq_bits: int = 8

    @property
    def min_train(self) -> int:
        """Vectors needed before the structure is built (FAISS's advice: 39 per IVF list)."""
        if self.kind != "ivf":
            return 1
        return max(39 * self.nlist, 39 * 2**self.pq_bits if self.pq_m else 0)  # FAISS: 39 points per centroid

    @property
    def ef_construction(self) -> int:
        """HNSW build width: wider than the 2·M links a node keeps on level 0, or they are filled from
        too few candidates. FAISS's default 40 is narrower than HNSW32's 64 links, and at a million vectors its
        graph never reached the recall target that 2.5·M reaches (RESULTS.md, "Search index")."""
        return max(40, 5 * self.hnsw_m // 2)


def parse_index_type(spec: str, dimension: int) -> IndexType:
    if spec == "Flat":
        return IndexType(spec, "flat")
    if m := _HNSW.match(spec):
        hnsw_m = int(m.group(1))
        if not 4 <= hnsw_m <= 128:
            raise InvalidRequest(f"index type {spec!r}: HNSW takes 4 to 128 links per node")
        return IndexType(spec, "hnsw", hnsw_m=hnsw_m)
    if m := _IVF.match(spec):
        nlist, pq_m, pq_bits = int(m.group(1)), int(m.group(3) or 0), int(m.group(4) or 8)
        if not 1 <= nlist <= 65536:
            raise InvalidRequest(f"index type {spec!r}: IVF takes 1 to 65536 lists")
        if pq_m and dimension % pq_m:
            raise InvalidRequest(f"index type {spec!r}: PQ{pq_m} must divide the dimension {dimension}")
        if not 1 <= pq_bits <= 8:
            raise InvalidRequest(f"index type {spec!r}: PQ codes take 1 to 8 bits")
        return IndexType(spec, "ivf", nlist=nlist, pq_m=pq_m, pq_bits=pq_bits)
    raise InvalidRequest(f"unknown index type {spec!r}: use Flat, HNSW<M> (e.g. HNSW32), IVF<n>,SQ8 or "
                         f"IVF<n>,PQ<m>[x<bits>]")


def check_quantization(quantization: str, kind: IndexType) -> str:
    """The quantization if this index type can store it; InvalidRequest naming the options if not."""
    if quantization not in QUANTIZATIONS:
        raise InvalidRequest(f"unknown quantization {str(quantization)[:40]!r}: use none, int8 or binary")
    if quantization != "none" and kind.kind == "ivf":
        raise InvalidRequest(f"quantization {quantization!r} applies to Flat and HNSW<M> index types: {kind.spec} "
                             f"already stores compressed codes (use it with quantization 'none', or Flat / "
                             f"HNSW<M> with 'int8' or 'binary')")
    return quantization


def check_oversample(oversample: int | None) -> None:
    if oversample is not None and not 1 <= oversample <= MAX_OVERSAMPLE:
        raise InvalidRequest(f"oversample must be between 1 and {MAX_OVERSAMPLE}")


class FloatFile:
    """Float vectors in a file mapped into memory (the page cache keeps what searches touch, the
    process holds none of it): the file grows and is mapped longer; a map read earlier stays valid
    for its reader. Not durable by itself (the log and snapshots are): it is rebuilt at start."""

    def __init__(self, folder: Path, dimension: int):
        fd, name = tempfile.mkstemp(prefix="floats-", suffix=".f32", dir=folder)
        os.close(fd)
        self.path, self.dimension, self.rows = Path(name), dimension, 0

    def grow(self, rows: int) -> np.ndarray:
        with open(self.path, "r+b") as f:
            f.truncate(rows * self.dimension * 4)
        self.rows = rows
        return np.memmap(self.path, dtype=np.float32, mode="r+", shape=(rows, self.dimension))

    @property
    def nbytes(self) -> int:
        return self.rows * self.dimension * 4

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


class VectorSet:
    """Slots + tombstones + a derived ANN structure. The owner serialises writes; `_store_lock` keeps
    a write and the builder's trimming of the slot array apart; the builder thread and every reader
    of the structure share `_ann_lock`, since a FAISS index may not be read while it grows."""

    def __init__(self, dimension: int, index_type: str, background: bool = True, gpu_mode: str = "auto",
                 quantization: str = "none", oversample: int = DEFAULT_OVERSAMPLE, float_dir: Path | None = None):
        self.dimension = dimension
        self.type = parse_index_type(index_type, dimension)
        self.quantization = check_quantization(quantization, self.type)
        check_oversample(oversample)
        self.oversample = oversample
        self._quantized = quantization != "none"
        self._structured = self.type.kind != "flat" or self._quantized  # there is a structure to build
        self._ranges: np.ndarray | None = None  # int8: the trained per-dimension (min, width), FAISS's layout
        # GPU resources when a GPU copy is kept (Flat, IVF; never HNSW or quantized); the copy covers the same
        # slots as `_covered` (for Flat, `_covered` and `_dead_covered` count what the GPU copy holds).
        self._gpu = gpu.resources(gpu_mode) if self.type.kind != "hnsw" and not self._quantized else None
        self._gpu_ann: faiss.Index | None = None
        # Quantized with float_dir: the slot array is a file there, mapped (FloatFile).
        self._floats = FloatFile(float_dir, dimension) if self._quantized and float_dir is not None else None
        # (rows, base): the vectors of slots base, base + 1, ... (replaced, never shrunk in place, so a
        # reader holding one sees rows that never change). base > 0 only for HNSW: slots below it are
        # read from the structure.
        self._store = (self._floats.grow(1024) if self._floats else np.empty((1024, dimension), dtype=np.float32), 0)
        self._store_lock = threading.Lock()
        self._live = np.zeros(1024, dtype=bool)
        self.n = 0  # slots used
        self.count = 0  # live slots
        self._ann: faiss.Index | None = None
        self._covered = 0
        self._dead_covered = 0
        # the structure keeps full vectors: no second copy (quantized: it keeps codes, the array the floats)
        self._holds_vectors = self.type.kind == "hnsw" and not self._quantized
        # (structure, its size, ids, vectors): numpy views of its memory, under _ann_lock
        self._arrays: tuple[faiss.Index, int, np.ndarray, np.ndarray] | None = None
        self._ann_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._builder = None
        if (self._structured or self._gpu is not None) and background:
            self._builder = threading.Thread(target=self._build_loop, daemon=True, name="ann-builder")
            self._builder.start()

    # writes (the owner serialises them) ---------------------------------------------------------

    def append(self, vectors: np.ndarray) -> np.ndarray:
        rows = len(vectors)
        with self._store_lock:
            array, base = self._store
            n = self.n
            if n + rows > base + len(array):
                # Grow (old arrays stay valid for readers holding them); HNSW drops what it covers.
                new_base = min(self._covered, n) if self._holds_vectors else base
                kept = n - new_base
                size = max(2 * len(array) if new_base == base else 2 * kept, kept + rows, 1024)
                if self._floats is not None:  # base stays 0: the file keeps the rows, mapped longer
                    array = self._floats.grow(size)
                else:
                    grown = np.empty((size, self.dimension), dtype=np.float32)
                    grown[:kept] = array[new_base - base: n - base]
                    array, base = grown, new_base
                self._store = (array, base)
            if n + rows > len(self._live):
                live = np.zeros(max(2 * len(self._live), n + rows), dtype=bool)
                live[:n] = self._live[:n]
                self._live = live
            array[n - base: n - base + rows] = vectors
            self._live[n: n + rows] = True
            self.n = n + rows
        self.count += rows
        if self.quantization == "int8" and self._ranges is None and self.count >= QUANT_TRAIN_ROWS:
            self._train()
        self._wake.set()
        return np.arange(n, n + rows, dtype=np.int64)

    def _train(self) -> None:
        """int8: the ranges from the live vectors now (at most QUANT_TRAIN_MAX, evenly spread by slot).
        Deterministic: the same live vectors in the same order give the same ranges."""
        rows = np.flatnonzero(self._live[: self.n])
        if len(rows) > QUANT_TRAIN_MAX:
            rows = rows[np.linspace(0, len(rows) - 1, QUANT_TRAIN_MAX).astype(np.int64)]
        vectors, _ = self.gather(rows, self._store, None)  # quantized: every slot is in the array
        sq = faiss.ScalarQuantizer(self.dimension, faiss.ScalarQuantizer.QT_8bit)
        sq.rangestat = faiss.ScalarQuantizer.RS_minmax
        sq.rangestat_arg = QUANT_RANGE_MARGIN
        sq.train(np.ascontiguousarray(vectors, dtype=np.float32))
        self._ranges = faiss.vector_to_array(sq.trained).astype(np.float32)

    @property
    def ranges(self) -> np.ndarray | None:
        """int8: the trained ranges (None until trained), for a snapshot."""
        return self._ranges

    def set_ranges(self, ranges: np.ndarray) -> None:
        """int8: ranges a snapshot kept (before its vectors are appended, so they are not trained again)."""
        if self.quantization != "int8" or ranges.shape != (2 * self.dimension,):
            raise ValueError(f"ranges of shape {ranges.shape} for a {self.quantization} set of dimension "
                             f"{self.dimension}")
        self._ranges = np.asarray(ranges, dtype=np.float32)

    def kill(self, slots: np.ndarray) -> None:
        if len(slots):
            self._live[slots] = False
            self.count -= len(slots)
            self._dead_covered += int(np.count_nonzero(slots < self._covered))
            self._wake.set()

    def live_flags(self) -> np.ndarray:
        """The live flag of each slot (at least `n` of them; the array is replaced when it grows)."""
        return self._live

    def vector(self, slot: int) -> np.ndarray | None:
        """A slot's vector (a copy when the structure holds it); None if it is gone (dead, and dropped
        by a rebuild)."""
        vectors, found = self.gather(np.array([slot], dtype=np.int64), self._store, self._ann)
        return vectors[0] if found[0] else None

    def view(self) -> tuple[LiveRows, np.ndarray]:
        """(vectors, live) of the used slots, for a snapshot: `vectors[rows]` gathers live rows later,
        from the array and structure of now (written rows never change; a structure replaced since
        is kept alive by the view)."""
        return LiveRows(self, self._store, self._ann), self._live[: self.n].copy()

    def memory(self) -> dict[str, int]:
        """Bytes held for vectors: the slot array (its allocated rows) and the structure's own copy
        (HNSW's full vectors, IVF's codes); the HNSW graph and the IVF lists' ids are counted apart."""
        array, _ = self._store
        out = {"slots": array.nbytes if self._floats is None else 0,
               "slots_on_disk": self._floats.nbytes if self._floats is not None else 0,
               "structure_vectors": 0, "structure_other": 0}
        with self._ann_lock:
            if self._ann is None:
                return out
            if self._quantized:
                out.update(self._quantized_memory())
            elif self.type.kind == "hnsw":
                hnsw = faiss.downcast_index(self._ann.index)
                out["structure_vectors"] = faiss.downcast_index(hnsw.storage).codes.size()
                g = hnsw.hnsw
                out["structure_other"] = (g.neighbors.size() * 4 + g.offsets.size() * 8 + g.levels.size() * 4
                                          + self._ann.id_map.size() * 8)
            else:
                ivf = faiss.extract_index_ivf(self._ann)
                out["structure_vectors"] = ivf.invlists.compute_ntotal() * ivf.code_size
                out["structure_other"] = ivf.invlists.compute_ntotal() * 8
        return out

    def _quantized_memory(self) -> dict[str, int]:
        """(codes, the rest) of a quantized structure: int8 or sign-bit codes; the HNSW graph and ids."""
        ann = self._ann
        if ann is None:
            return {}
        binary = self.quantization == "binary"
        inner = faiss.downcast_IndexBinary(ann.index) if binary else faiss.downcast_index(ann.index)
        other = ann.id_map.size() * 8
        if self.type.kind == "hnsw":
            storage = faiss.downcast_IndexBinary(inner.storage) if binary else faiss.downcast_index(inner.storage)
            g = inner.hnsw
            other += g.neighbors.size() * 4 + g.offsets.size() * 8 + g.levels.size() * 4
        else:
            storage = inner
        return {"structure_vectors": (storage.xb if binary else storage.codes).size(), "structure_other": other}

    @property
    def ann_ready(self) -> bool:
        if not self._structured or self.n == 0:
            return True
        return self._ann is not None and self._covered >= self.n - BUILD_CHUNK

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._builder is not None:
            self._builder.join(timeout=10)
        if self._floats is not None:
            self._floats.close()  # maps still held (a snapshot being written) keep the file's pages

    # reading vectors ----------------------------------------------------------------------------

    def gather(self, slots: np.ndarray, store, ann) -> tuple[np.ndarray, np.ndarray]:
        """(vectors of `slots`, found): rows from the array at or above its base, the rest from `ann`'s
        storage (HNSW: a slot below base is covered, so it is there unless it died before a rebuild)."""
        array, base = store
        high = slots >= base
        if high.all():
            return array[slots - base], high
        if ann is None or not ann.ntotal:
            out = np.zeros((len(slots), self.dimension), dtype=np.float32)
            out[high] = array[slots[high] - base]
            return out, high
        low = np.flatnonzero(~high)
        with self._ann_lock:  # the storage may move while the builder adds to it
            ids, stored = self._structure_arrays(ann)
            pos = np.searchsorted(ids, slots[low])
            np.minimum(pos, len(ids) - 1, out=pos)
            ok = ids[pos] == slots[low]
            if len(low) == len(slots) and ok.all():  # the usual case once trimmed: one copy
                return stored[pos], ok
            out = np.zeros((len(slots), self.dimension), dtype=np.float32)
            out[low[ok]] = stored[pos[ok]]
        out[high] = array[slots[high] - base]
        found = high
        found[low[ok]] = True
        return out, found

    def _structure_arrays(self, ann) -> tuple[np.ndarray, np.ndarray]:
        """(ids by position, vectors by position) of an IndexIDMap(IndexHNSWFlat): views of FAISS memory,
        valid while it holds the same number of vectors (only an add moves them). Under _ann_lock."""
        cached = self._arrays
        if cached is None or cached[0] is not ann or cached[1] != ann.ntotal:
            storage = faiss.downcast_index(faiss.downcast_index(ann.index).storage)
            ntotal = ann.ntotal
            ids = faiss.rev_swig_ptr(ann.id_map.data(), ntotal)
            stored = faiss.rev_swig_ptr(storage.get_xb(), ntotal * self.dimension).reshape(ntotal, self.dimension)
            cached = self._arrays = (ann, ntotal, ids, stored)
        return cached[2], cached[3]

    # search -----------------------------------------------------------------------------------

    def search(self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None,
               ef_search: int | None = None, nprobe: int | None = None,
               oversample: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, slots), each (len(queries), k'), best first; padded with -inf / -1. Quantized: the
        structure's k × oversample best are rescored with the float vectors."""
        n = self.n  # read before the arrays: an array read after n holds at least n rows, even if it grew
        store = self._store
        self._check_params(k, ef_search, nprobe)
        check_oversample(oversample)
        live = None  # an O(n) copy of the live flags: only where exact search or a filter needs it
        if allowed is not None:
            live = self._live[:n].copy()
            allowed = allowed[live[allowed]]
            candidates = len(allowed)
        elif self._ann is not None:
            candidates = min(self.count, n)  # kept by the writer: no O(n) count per query
        else:
            live = self._live[:n].copy()
            candidates = int(np.count_nonzero(live))
        k = min(k, candidates)
        if k == 0:
            return np.empty((len(queries), 0), np.float32), np.empty((len(queries), 0), np.int64)
        if allowed is None and self._gpu_ann is not None:
            found = self._gpu_search(queries, k, n, store, nprobe)
            if found is not None:
                return found
        if self._ann is None or (allowed is not None and candidates <= EXACT_BELOW):
            return self._exact(queries, store, live, k, allowed)
        first = k
        if self._quantized:
            first = min(max(k, min(k * (oversample or self.oversample), MAX_CANDIDATES)), candidates)
        with self._ann_lock:
            covered = self._covered
            scores, slots = self._ann_search(queries, first, n, allowed, ef_search, nprobe)
        if self._quantized:
            scores, slots = self._rescore(queries, store, slots, k)
        scores, slots = self._with_tail(queries, store, scores, slots, k, covered, n, allowed)
        if (slots >= 0).sum(axis=1).min() < k:  # the structure could not reach k allowed documents
            live = self._live[:n].copy() if live is None else live
            return self._exact(queries, store, live, min(k, int(np.count_nonzero(live))), allowed)
        return scores, slots

    def _gpu_search(self, queries, k, n, store, nprobe):
        """Unfiltered search on the GPU copy (asked for k + its dead slots, which are then dropped), plus
        the exact pass over the slots it does not cover yet; None when the CPU must answer instead."""
        with self._ann_lock:
            covered, dead = self._covered, self._dead_covered
            ask = min(k + dead, covered)
            if ask > gpu.MAX_K or ask == 0:
                return None
            params = None if self.type.kind == "flat" else \
                faiss.SearchParametersIVF(nprobe=min(nprobe or DEFAULT_NPROBE, self.type.nlist))
            if self._gpu_ann is None:
                raise RuntimeError("a GPU search without a GPU copy")
            scores, slots = self._gpu_ann.search(np.ascontiguousarray(queries, dtype=np.float32), ask, params=params)
        live = self._live  # read after `covered`: it holds at least `covered` rows
        valid = (slots >= 0) & (slots < min(n, covered))
        valid[valid] = live[slots[valid]]
        scores = np.where(valid, scores, -np.inf).astype(np.float32)
        slots = np.where(valid, slots, -1)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        scores, slots = np.take_along_axis(scores, order, axis=1), np.take_along_axis(slots, order, axis=1)
        scores, slots = self._with_tail(queries, store, scores, slots, k, covered, n, None)
        if (slots >= 0).sum(axis=1).min() < k:  # IVF's probes did not reach k documents: the CPU answers
            return None
        return scores, slots

    def _rescore(self, queries, store, slots, k):
        """The k best of each query's candidate slots by exact inner product with their float vectors
        (quantized: all in the array, base 0), best first; candidates keep their order among ties."""
        array, base = store
        valid = slots >= 0
        vectors = array[np.where(valid, slots, base) - base]  # (queries, candidates, dimension)
        scores = np.matmul(vectors, queries[:, :, None])[:, :, 0]
        scores[~valid] = -np.inf
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return (np.take_along_axis(scores, order, axis=1).astype(np.float32),
                np.take_along_axis(np.where(valid, slots, -1), order, axis=1))

    def _with_tail(self, queries, store, scores, slots, k, covered, n, allowed):
        """A structure's hits merged with exact search over the (allowed, live) slots it has not
        reached yet, [covered, n): they are in the array, as base <= covered."""
        if covered >= n:
            return scores, slots
        tail = np.arange(covered, n)
        tail = tail[self._live[covered:n]] if allowed is None else allowed[allowed >= covered]
        ts, tl = self._exact(queries, store, None, min(k, len(tail)), tail)
        return _merge(scores, slots, ts, tl, k)

    def _check_params(self, k: int, ef_search: int | None, nprobe: int | None) -> None:
        if ef_search is not None and not max(k, 1) <= ef_search <= MAX_EF_SEARCH:
            raise InvalidRequest(f"ef_search must be between k ({k}) and {MAX_EF_SEARCH}")
        if nprobe is not None and not 1 <= nprobe <= max(self.type.nlist, 1):
            raise InvalidRequest(f"nprobe must be between 1 and the number of IVF lists ({self.type.nlist})")

    def _exact(self, queries, store, live, k, allowed):
        """Exact top k over `allowed` (all live slots when None), in blocks of EXACT_BLOCK slots."""
        rows = np.flatnonzero(live) if allowed is None else np.asarray(allowed, dtype=np.int64)
        if k == 0 or len(rows) == 0:
            return np.empty((len(queries), 0), np.float32), np.empty((len(queries), 0), np.int64)
        array, base = store
        # Contiguous live slots all in the array need no gather: score the block and mask the dead.
        if allowed is None and base == 0 and len(rows) > 0.5 * len(live):
            scores = queries @ array[: len(live)].T
            scores[:, ~live] = -np.inf
            return _top(scores, None, k)
        ann = self._ann  # read after `store`: it holds every live slot below base
        best = None
        for i in range(0, len(rows), EXACT_BLOCK):
            block = rows[i: i + EXACT_BLOCK]
            vectors, found = self.gather(block, store, ann)
            if not found.all():  # died and dropped by a rebuild since the caller read them
                vectors, block = vectors[found], block[found]
            if len(block):
                top = _top(queries @ vectors.T, block, k)
                best = top if best is None else _merge(*best, *top, k)
        if best is None:
            return np.empty((len(queries), 0), np.float32), np.empty((len(queries), 0), np.int64)
        return best

    def _ann_search(self, queries, k, n, allowed, ef_search, nprobe):
        """Search the structure (the caller holds _ann_lock); slots written after the caller read `n`
        (the builder may already cover them) are left out, as their documents may not be stored yet."""
        covered = self._covered
        selector: faiss.IDSelector | None = None
        if allowed is not None:
            selector = faiss.IDSelectorBatch(allowed[allowed < covered])
        elif self._dead_covered:  # tombstones inside the structure (kept by kill and the builder): skip them
            live = self._live  # read after `covered`: it holds at least `covered` rows
            bitmap = np.packbits(live[:covered], bitorder="little")
            selector = faiss.IDSelectorBitmap(covered, faiss.swig_ptr(bitmap))
        params: faiss.SearchParameters
        if self.type.kind == "hnsw":
            params = faiss.SearchParametersHNSW(efSearch=max(ef_search or DEFAULT_EF_SEARCH, k))
        elif self.type.kind == "ivf":
            params = faiss.SearchParametersIVF(nprobe=min(nprobe or DEFAULT_NPROBE, self.type.nlist))
        else:  # quantized Flat: a scan of the codes
            params = faiss.SearchParameters()
        if selector is not None:
            params.sel = selector
        if self._ann is None:
            raise RuntimeError("a structure search without a structure")
        scores, slots = self._ann.search(self._encode(queries), k, params=params)
        if self.quantization == "binary":  # Hamming distances: fewer differing bits rank first
            scores = -scores.astype(np.float32)
        slots[slots >= n] = -1
        scores[slots < 0] = -np.inf
        return scores, slots

    # the builder ------------------------------------------------------------------------------

    def _encode(self, vectors: np.ndarray) -> np.ndarray:
        """What the structure takes: sign bits (binary, padded to whole bytes), else the float rows."""
        if self.quantization == "binary":
            return np.packbits(vectors > 0, axis=1)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _new_quantized(self):
        t = self.type
        if self.quantization == "binary":
            bits = 8 * -(-self.dimension // 8)
            if t.kind == "hnsw":
                binary = faiss.IndexBinaryHNSW(bits, t.hnsw_m)
                binary.hnsw.efConstruction = t.ef_construction
                return faiss.IndexBinaryIDMap(binary)
            return faiss.IndexBinaryIDMap(faiss.IndexBinaryFlat(bits))
        if self._ranges is None:
            raise RuntimeError("an int8 structure before its ranges are trained")
        qt = faiss.ScalarQuantizer.QT_8bit
        if t.kind == "hnsw":
            index = faiss.IndexHNSWSQ(self.dimension, qt, t.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = t.ef_construction
            storage = faiss.downcast_index(index.storage)
        else:
            index = storage = faiss.IndexScalarQuantizer(self.dimension, qt, faiss.METRIC_INNER_PRODUCT)
        faiss.copy_array_to_vector(self._ranges, storage.sq.trained)
        storage.is_trained = index.is_trained = True
        return faiss.IndexIDMap(index)

    def _new_structure(self, rows: np.ndarray, store):
        t = self.type
        if self._quantized:
            return self._new_quantized()
        if t.kind == "hnsw":
            hnsw = faiss.IndexHNSWFlat(self.dimension, t.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            hnsw.hnsw.efConstruction = t.ef_construction
            return faiss.IndexIDMap(hnsw)
        quantizer = "SQ8" if not t.pq_m else f"PQ{t.pq_m}x{t.pq_bits}"
        index = faiss.index_factory(self.dimension, f"IVF{t.nlist},{quantizer}", faiss.METRIC_INNER_PRODUCT)
        if len(rows) > 256 * t.nlist:  # FAISS samples this many itself; sample here to save the copy
            pick = np.random.default_rng(0).choice(len(rows), 256 * t.nlist, replace=False)
            rows = rows[np.sort(pick)]
        index.train(np.ascontiguousarray(self.gather(rows, store, None)[0]))  # IVF: every slot is in the array
        return index

    def build_now(self) -> None:
        """Bring the structure up to date in the calling thread (tests, and the builder loop)."""
        if not self._structured:
            if self._gpu is not None:
                self._build_flat_copy()
            return
        if self.quantization == "int8" and self._ranges is None:
            return  # not trained yet: search is exact
        if self._ann is None or self._dead_covered > REBUILD_FRACTION * max(self._covered, 1):
            n = self.n
            store, old = self._store, self._ann  # read after n: they hold every slot below it
            live_rows = np.flatnonzero(self._live[:n])
            if len(live_rows) < self.type.min_train:
                return
            ann = self._new_structure(live_rows, store)
            for i in range(0, len(live_rows), BUILD_CHUNK * 8):
                rows = live_rows[i: i + BUILD_CHUNK * 8]
                vectors, found = self.gather(rows, store, old)  # all found: only this thread drops slots
                ann.add_with_ids(self._encode(vectors), rows)
            dead_since = int(np.count_nonzero(~self._live[live_rows]))  # killed while we built
            copy = gpu.copy_to_gpu(self._gpu, ann) if self._gpu is not None else None
            if copy is None:
                self._gpu = None  # none, or this FAISS cannot copy this type: the CPU answers from now on
            with self._ann_lock:
                self._ann, self._gpu_ann, self._covered, self._dead_covered = ann, copy, n, dead_since
                self._trim()
        while self._covered < self.n and not self._closed:
            start = self._covered
            end = min(self.n, start + BUILD_CHUNK)
            array, base = self._store  # base <= covered: the rows are in the array
            rows = np.arange(start, end, dtype=np.int64)
            chunk = self._encode(array[start - base: end - base])
            with self._ann_lock:
                if self._ann is None:
                    raise RuntimeError("the builder feeds a structure it did not build")
                self._ann.add_with_ids(chunk, rows)
                if self._gpu_ann is not None:
                    self._gpu_ann.add_with_ids(chunk, rows)
                self._covered = end
                self._dead_covered += int(np.count_nonzero(~self._live[start:end]))
                self._trim()

    def _build_flat_copy(self) -> None:
        """Flat on a GPU: an exact IndexFlatIP of the slots (ids = slots) on the GPU, fed as a structure
        is (rebuilt from the live slots once a fifth of it is dead, so asking for k + dead stays small)."""
        if self._gpu_ann is None or self._dead_covered > REBUILD_FRACTION * max(self._covered, 1):
            n = self.n
            array, _ = self._store  # Flat: base is 0
            live_rows = np.flatnonzero(self._live[:n])
            copy = gpu.copy_to_gpu(self._gpu, faiss.IndexIDMap(faiss.IndexFlatIP(self.dimension)))
            if copy is None:
                self._gpu = None  # this FAISS cannot: the CPU answers from now on
                return
            for i in range(0, len(live_rows), BUILD_CHUNK * 8):
                rows = live_rows[i: i + BUILD_CHUNK * 8]
                copy.add_with_ids(array[rows], rows)
            dead_since = int(np.count_nonzero(~self._live[live_rows]))
            with self._ann_lock:
                self._gpu_ann, self._covered, self._dead_covered = copy, n, dead_since
        while self._covered < self.n and not self._closed:
            start = self._covered
            end = min(self.n, start + BUILD_CHUNK * 8)
            array, _ = self._store
            with self._ann_lock:
                if self._gpu_ann is None:
                    raise RuntimeError("the builder feeds a GPU copy it did not make")
                self._gpu_ann.add_with_ids(np.ascontiguousarray(array[start:end]), np.arange(start, end))
                self._covered = end
                self._dead_covered += int(np.count_nonzero(~self._live[start:end]))

    def _trim(self) -> None:
        """HNSW: drop from the slot array the rows the structure now holds (a new, smaller array).
        Called by the builder under _ann_lock, so a search sees a covered slot in one place or both."""
        if not self._holds_vectors:
            return
        with self._store_lock:
            array, base = self._store
            covered, n = min(self._covered, self.n), self.n
            dropped = covered - base
            caught_up = covered == n and dropped >= MIN_ROWS  # all covered: keep no more than MIN_ROWS
            if not caught_up and dropped < max(TRIM_MIN, (n - base) // 2):
                return
            kept = n - covered
            trimmed = np.empty((max(2 * kept, MIN_ROWS), self.dimension), dtype=np.float32)
            trimmed[:kept] = array[covered - base: n - base]
            self._store = (trimmed, covered)

    def _build_loop(self) -> None:
        while not self._closed:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            if not self._closed:
                self.build_now()


class LiveRows:
    """`rows[slots]`: the vectors of live slots, gathered from an array and structure read earlier."""

    def __init__(self, owner: VectorSet, store, ann):
        self.owner, self.store, self.ann = owner, store, ann

    def __getitem__(self, slots) -> np.ndarray:
        slots = np.asarray(slots, dtype=np.int64)
        vectors, found = self.owner.gather(slots, self.store, self.ann)
        if not found.all():
            raise RuntimeError(f"{int(np.count_nonzero(~found))} live vectors are missing from the structure")
        return vectors


def _top(scores: np.ndarray, rows: np.ndarray | None, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best of each row of `scores` (columns are `rows`, or slots 0.. when None), best first."""
    k = min(k, scores.shape[1])
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    top_scores = np.take_along_axis(scores, top, axis=1)
    order = np.argsort(-top_scores, axis=1, kind="stable")
    top = np.take_along_axis(top, order, axis=1)
    slots = top if rows is None else rows[top]
    return np.take_along_axis(top_scores, order, axis=1).astype(np.float32), slots.astype(np.int64)


def _merge(s1, i1, s2, i2, k):
    scores = np.concatenate([s1, s2], axis=1)
    slots = np.concatenate([i1, i2], axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(slots, order, axis=1)
