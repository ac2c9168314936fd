"""A collection's sparse vectors (a SPLADE model's, one per chunk), by slot, searched by dot product.

The rows are scipy sparse matrices in column order (CSC: an inverted index, a column's entries being the
slots that hold that dimension), so a query reads only the columns of its own non-zero dimensions. Writes
append rows: a write's rows join a tail of small row-ordered (CSR) pieces; once the tail holds
`TAIL_ROWS` rows it becomes a column-ordered block, and a block is merged with the one before it while that
one is no larger (up to `MAX_BLOCK_ROWS`), so a collection of n rows has O(log n) blocks and each row is
copied O(log n) times. A merge leaves out the entries of dead slots (deleted or replaced: a slot never
comes back to life), and a block a quarter of whose rows died since it was made is made again without them, so
their memory is given back; a snapshot's load stores the live rows alone.

Only the committer thread appends. Searches run beside it without a lock: the store's state (its blocks and
tail) is one immutable tuple, replaced whole, and a written row never changes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from service.index.base import SparseRows

TAIL_ROWS = 2048  # rows kept in row-ordered pieces before they become a column-ordered block
MAX_BLOCK_ROWS = 65_536  # a merge makes no block larger: it bounds the pause a merge takes on the committer


class _Block(NamedTuple):
    first: int  # its first slot
    matrix: sp.csc_array  # rows: slots first ... first + rows - 1
    dropped: int = 0  # its dead rows whose entries were left out when it was made


class _State(NamedTuple):
    blocks: tuple[_Block, ...]
    tail_first: int
    tail: tuple[sp.csr_array, ...]  # each write's rows, in slot order
    end: int  # slots below this are stored


def as_matrix(rows: SparseRows, dimension: int) -> sp.csr_array:
    return sp.csr_array((rows.values, rows.indices, rows.indptr), shape=(len(rows.indptr) - 1, dimension))


def _rows_of(pieces: Sequence[sp.sparray], dimension: int) -> sp.csr_array:
    """Rows one under another, in row order (scipy's fast path for stacking)."""
    if not pieces:
        return sp.csr_array((0, dimension), dtype=np.float32)
    return sp.csr_array(sp.vstack([sp.csr_array(p) for p in pieces], format="csr", dtype=np.float32))


def _stack(pieces: Sequence[sp.sparray], dimension: int) -> sp.csc_array:
    """Rows one under another, in column order (stacked as CSR, then converted once)."""
    return sp.csc_array(_rows_of(pieces, dimension).tocsc())


class SparseStore:
    """Rows by slot: `append` (the committer), `search` and `rows` (any thread)."""

    def __init__(self, dimension: int):
        self.dimension = dimension  # the sparse model's vocabulary: indices are below it
        self._state = _State((), 0, (), 0)
        self._tail_cache: tuple[tuple[sp.csr_array, ...], sp.csr_array] | None = None
        self._cache_lock = threading.Lock()

    @property
    def count(self) -> int:
        """Slots below this are stored."""
        return self._state.end

    def append(self, first_slot: int, rows: SparseRows, live: np.ndarray) -> None:
        """Rows for slots first_slot ...; `live`: the collection's live flags (what a merge keeps)."""
        state = self._state
        if first_slot != state.end:
            raise RuntimeError(f"sparse store out of step: slot {first_slot} written after {state.end}")
        piece = as_matrix(rows, self.dimension)
        if not piece.shape[0]:
            return
        tail = (*state.tail, piece)
        end = state.end + piece.shape[0]
        if end - state.tail_first < TAIL_ROWS:
            self._state = _State(state.blocks, state.tail_first, tail, end)
            return
        blocks = [*state.blocks, _Block(state.tail_first, _stack(tail, self.dimension))]
        while len(blocks) > 1 and (rows_before := blocks[-2].matrix.shape[0]) <= blocks[-1].matrix.shape[0] \
                and rows_before + blocks[-1].matrix.shape[0] <= MAX_BLOCK_ROWS:
            last = blocks.pop()
            before = blocks.pop()
            blocks.append(self._live_only(before.first, _stack([before.matrix, last.matrix], self.dimension), live))
        # a block no merge takes any more (the largest) is made again once a quarter of it died since it was made
        blocks = [self._live_only(b.first, b.matrix, live)
                  if 4 * (self._dead(b, live) - b.dropped) >= max(b.matrix.shape[0], 1) else b for b in blocks]
        self._state = _State(tuple(blocks), end, (), end)

    @staticmethod
    def _dead(block: _Block, live: np.ndarray) -> int:
        rows = block.matrix.shape[0]
        return rows - int(np.count_nonzero(live[block.first: block.first + rows]))

    def _live_only(self, first: int, matrix: sp.csc_array, live: np.ndarray) -> _Block:
        """The block of `matrix` at slot `first` without the entries of slots no longer live."""
        rows = matrix.shape[0]
        alive = np.zeros(rows, dtype=bool)
        flags = live[first: first + rows]
        alive[: len(flags)] = flags
        dead = rows - int(np.count_nonzero(alive))
        keep = alive[matrix.indices]
        if keep.all():
            return _Block(first, matrix, dead)
        columns = np.repeat(np.arange(self.dimension), np.diff(matrix.indptr))[keep]
        kept = sp.coo_array((matrix.data[keep], (matrix.indices[keep], columns)), shape=matrix.shape).tocsc()
        return _Block(first, sp.csc_array(kept), dead)

    def _tail(self, state: _State) -> sp.csr_array:
        """The tail as one row-ordered matrix (a query reads all of it: it is small), made once per state by the
        first search that needs it."""
        with self._cache_lock:
            cached = self._tail_cache
        if cached is not None and cached[0] is state.tail:
            return cached[1]
        matrix = _rows_of(state.tail, self.dimension)
        with self._cache_lock:
            self._tail_cache = (state.tail, matrix)
        return matrix

    def scores(self, indices: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The dot product of one query (its non-zero dimensions and their values) with every stored slot."""
        state = self._state
        out = np.zeros(state.end, dtype=np.float32)
        keep = (indices >= 0) & (indices < self.dimension)  # a dimension the store cannot hold scores nothing
        indices, values = np.asarray(indices[keep], np.int64), np.asarray(values[keep], np.float32)
        if not len(indices):
            return out
        for block in state.blocks:  # the columns of the query's dimensions
            out[block.first: block.first + block.matrix.shape[0]] = block.matrix[:, indices] @ values
        tail = self._tail(state)
        if tail.shape[0]:  # every row: a dense query
            query = np.zeros(self.dimension, np.float32)
            np.add.at(query, indices, values)
            out[state.tail_first:] = tail @ query
        return out

    def search(self, queries: Sequence[tuple[Sequence[int], Sequence[float]]], k: int, live: np.ndarray,
               allowed: np.ndarray | None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query, (scores, slots) of up to k live slots (in `allowed`, ascending, when given) whose dot
        product with it is positive, best first (ties: the earlier slot first)."""
        out = []
        for indices, values in queries:
            scores = self.scores(np.asarray(indices, np.int64), np.asarray(values, np.float32))
            n = len(scores)
            ok = scores > 0
            flags = live[:n]
            ok[: len(flags)] &= flags
            ok[len(flags):] = False
            if allowed is not None:
                mask = np.zeros(n, dtype=bool)
                mask[allowed[allowed < n]] = True
                ok &= mask
            slots = np.flatnonzero(ok)
            found = scores[slots]
            if len(slots) > k:
                top = np.argpartition(-found, k - 1)[:k]
                slots, found = slots[top], found[top]
            order = np.lexsort((slots, -found))
            out.append((found[order], slots[order]))
        return out

    def view(self) -> _State:
        """The store as it is now, for a snapshot (the committer calls it between writes): `rows` reads it later."""
        return self._state

    def rows(self, state: _State, slots: np.ndarray) -> sp.csr_array:
        """The rows of `slots` (ascending, below state.end) in the store as `state` held it: a snapshot's."""
        pieces = []
        parts: list[tuple[int, sp.sparray]] = [(b.first, b.matrix) for b in state.blocks]
        for first, matrix in (*parts, (state.tail_first, self._tail(state))):
            size = matrix.shape[0]
            mine = slots[(slots >= first) & (slots < first + size)]
            if len(mine):
                pieces.append(sp.csr_array(matrix)[mine - first])
        if not pieces:
            return sp.csr_array((0, self.dimension), dtype=np.float32)
        return sp.csr_array(sp.vstack(pieces, format="csr", dtype=np.float32))
