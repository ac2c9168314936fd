"""A collection's metadata index: a filter (filters.py's tree) evaluated as numpy masks over slots.

Every scalar a filter can reach is recorded at write time under its path (the tuple of keys through
nested objects), in one of two columns of that path:

  - numbers (int and float, never bool): entries sorted by value, so equality and the ranges are two
    np.searchsorted each. The value is held exactly as a pair (hi, lo): hi = float(v) (rounded to
    nearest), lo = v - hi for an int beyond 2**53 (0 otherwise). Pairs sort as the numbers do, so an
    int and a float compare exactly as Python compares them (2**53 + 1 is not 2.0**53);
  - strings, booleans and null: each distinct value gets a code, and the entries sorted by code are
    an inverted index (the slots of one value are one run, found by np.searchsorted): a value costs
    one dict entry, a slot 12 bytes, whatever the number of distinct values.

What filters.py compares to nothing is not recorded: a list or an object is never equal to a scalar
and never a number, so for every operator it reads as a missing field ($eq, $in and the ranges never
match; $ne and $nin always do). Lists are not searched inside. A key with a '.' in it cannot be named
by a filter (paths split on '.'), so nothing under it is recorded.

$ne and $nin are complements over every slot (a document without the field matches them), and the
caller keeps only live slots. Columns are append-only in slot order: a write appends to a short
unsorted tail, which a filter scans with vectorised comparisons; once the tail passes an eighth of the
sorted part, the two are merged (one sort) and dead slots dropped. A slot's metadata never changes (a
replaced document gets a new slot), so nothing is updated in place and a delete touches no column.

Threads: one writer (the collection's committer) and any number of readers, without a lock. Each
column publishes its state as one immutable tuple; the writer only writes past what a published state
covers, or builds new arrays and publishes them, so a reader sees a consistent column however the
writes interleave. A reader evaluates over the slots that were fully written when it started (`count`,
read first) and ANDs the live flags read *after* the mask: a merge drops only slots already dead.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from service.index.filters import And, Field, Node, Or, kind

MERGE_MIN = 4096  # tail entries before a merge is considered
MERGE_SHARE = 8  # ... and the tail must pass 1/MERGE_SHARE of the sorted part
EXACT_INT = 2**53  # ints beyond this do not survive float(): their remainder goes to `lo`
_CODED = ("bool", "str", "NoneType")

#: a coded column's dictionary: (value → code, code → value)
_Codes = tuple[dict[Any, int], list[Any]]
#: a column's published state: see _Column
_State = tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray, tuple[np.ndarray, ...], int, int, _Codes | None]


def number_key(v: int | float) -> tuple[float, float]:
    """(hi, lo) with hi + lo == v exactly and pairs ordered as the numbers are (an int too large for a
    float sorts past every finite one)."""
    if isinstance(v, float) or -EXACT_INT <= v <= EXACT_INT:
        return float(v), 0.0
    try:
        hi = float(v)
    except OverflowError:
        return (math.inf if v > 0 else -math.inf), 0.0
    return hi, float(v - int(hi))


class _Column:
    """(slot, key arrays) entries of one path and one kind: a sorted part plus an unsorted tail in slot
    order. `state` = (sorted slots, sorted keys, tail slots, tail keys, tail length, slot bound, codes)
    is replaced, never changed, except past the tail length, where only the writer writes. `codes` is a
    coded column's dictionary, published with the codes it explains: (value → code, code → value);
    new values are added to it in place (codes are never reused within one dictionary)."""

    def __init__(self, dtypes: tuple[type, ...], coded: bool = False):
        self.dtypes = dtypes
        self.state: _State = (np.empty(0, np.int64), tuple(np.empty(0, dt) for dt in dtypes), np.empty(64, np.int64),
                      tuple(np.empty(64, dt) for dt in dtypes), 0, 0, ({}, []) if coded else None)

    def code(self, value: Any) -> int:
        """The code of a string, boolean or null (a coded column), made if new."""
        codes, values = _dictionary(self.state[6])
        c = codes.get(value)
        if c is None:
            c = codes[value] = len(values)
            values.append(value)
        return c

    def append(self, slots: np.ndarray, keys: tuple[np.ndarray, ...]) -> None:
        s_slots, s_keys, t_slots, t_keys, t_n, bound, codes = self.state
        m = len(slots)
        if t_n + m > len(t_slots):  # grow: readers holding the old arrays still read them
            cap = max(2 * len(t_slots), t_n + m)
            t_slots = _grown(t_slots, t_n, cap)
            t_keys = tuple(_grown(k, t_n, cap) for k in t_keys)
        t_slots[t_n: t_n + m] = slots
        for dst, src in zip(t_keys, keys):
            dst[t_n: t_n + m] = src
        self.state = (s_slots, s_keys, t_slots, t_keys, t_n + m, max(bound, int(slots[-1]) + 1), codes)

    def needs_merge(self) -> bool:
        return self.state[4] >= MERGE_MIN and self.state[4] * MERGE_SHARE >= len(self.state[0])

    def merge(self, live: np.ndarray) -> None:
        """Sort the tail into the sorted part, dropping dead slots (`live[slot]` False); a coded column
        whose dictionary is mostly unused values (of dead slots) is renumbered with a new one."""
        s_slots, s_keys, t_slots, t_keys, t_n, bound, codes = self.state
        slots = np.concatenate([s_slots, t_slots[:t_n]])
        keys = [np.concatenate([s, t[:t_n]]) for s, t in zip(s_keys, t_keys)]
        keep = live[slots]
        if not keep.all():
            slots, keys = slots[keep], [k[keep] for k in keys]
        if codes is not None and len(codes[1]) > MERGE_MIN:
            used = np.unique(keys[0])
            if 2 * len(used) < len(codes[1]):
                remap: np.ndarray = np.zeros(len(codes[1]), self.dtypes[0])
                remap[used] = np.arange(len(used))
                keys[0] = remap[keys[0]]
                values = [codes[1][c] for c in used.tolist()]
                codes = ({v: i for i, v in enumerate(values)}, values)
        order = np.lexsort(keys[::-1]) if len(keys) > 1 else np.argsort(keys[0], kind="stable")
        cap = max(64, t_n // 4)
        self.state = (slots[order], tuple(k[order] for k in keys), np.empty(cap, np.int64),
                      tuple(np.empty(cap, dt) for dt in self.dtypes), 0, bound, codes)

    def nbytes(self) -> int:
        s_slots, s_keys, t_slots, t_keys, *_ = self.state
        return s_slots.nbytes + t_slots.nbytes + sum(k.nbytes for k in (*s_keys, *t_keys))


def _grown(a: np.ndarray, n: int, cap: int) -> np.ndarray:
    out = np.empty(cap, a.dtype)
    out[:n] = a[:n]
    return out


def _dictionary(codes: _Codes | None) -> _Codes:
    if codes is None:
        raise TypeError("a numbers column has no dictionary of codes")
    return codes


def _bound(keys: tuple[np.ndarray, ...], target: tuple, side: Literal["left", "right"]) -> int:
    """Where `target` goes in lexicographically sorted `keys` (np.searchsorted over key tuples)."""
    lo, hi = 0, len(keys[0])
    for key, t in zip(keys[:-1], target[:-1]):
        lo, hi = lo + int(np.searchsorted(key[lo:hi], t, "left")), lo + int(np.searchsorted(key[lo:hi], t, "right"))
    return lo + int(np.searchsorted(keys[-1][lo:hi], target[-1], side))


def _compare(keys: tuple[np.ndarray, ...], target: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(less, equal) masks of unsorted `keys` against `target`, lexicographically."""
    less = np.zeros(len(keys[0]), bool)
    equal = np.ones(len(keys[0]), bool)
    for key, t in zip(keys, target):
        less |= equal & (key < t)
        equal &= key == t
    return less, equal


class _Path:
    """The columns of one path: numbers as (hi, lo); strings, booleans and null as codes."""

    def __init__(self):
        self.numbers = _Column((np.float64, np.float64))
        self.coded = _Column((np.int32,), coded=True)


class MetadataIndex:
    def __init__(self):
        self._paths: dict[tuple[str, ...], _Path] = {}
        self.count = 0  # slots [0, count) are recorded

    # writes (the collection's one writer) ----------------------------------------------------------

    def add(self, first_slot: int, metadatas: list[dict[str, Any]], live: np.ndarray) -> None:
        """Record the metadata of slots first_slot, first_slot + 1, ...; `live` (flags by slot) lets a
        merge drop dead slots."""
        numbers: dict[tuple[str, ...], tuple[list[int], list[Any], list[tuple[int, int]]]] = {}
        coded: dict[tuple[str, ...], tuple[list[int], list[int]]] = {}
        paths = self._paths
        for slot, metadata in enumerate(metadatas, first_slot):
            stack: list[tuple[tuple[str, ...], dict[str, Any]]] = [((), metadata)]
            while stack:
                prefix, obj = stack.pop()
                for key, value in obj.items():
                    if "." in key:
                        continue
                    path = (*prefix, key)
                    if isinstance(value, dict):
                        stack.append((path, value))
                        continue
                    k = kind(value)
                    if k == "number":
                        if value != value:  # NaN (refused at write time): equal to nothing, in no range
                            continue
                        entry = numbers.get(path)
                        if entry is None:
                            entry = numbers[path] = ([], [], [])
                        if isinstance(value, int) and not -EXACT_INT <= value <= EXACT_INT:
                            entry[2].append((len(entry[1]), value))
                        entry[0].append(slot)
                        entry[1].append(value)
                    elif k in _CODED:
                        p = paths.get(path)
                        if p is None:
                            p = paths[path] = _Path()
                        coded_entry = coded.get(path)
                        if coded_entry is None:
                            coded_entry = coded[path] = ([], [])
                        coded_entry[0].append(slot)
                        coded_entry[1].append(p.coded.code(value))
        for path, (slots, values, big) in numbers.items():
            p = paths.get(path)
            if p is None:
                p = paths[path] = _Path()
            for i, _ in big:  # float() would round them (or overflow): exact pairs below
                values[i] = 0.0
            hi = np.array(values, dtype=np.float64)
            lo = np.zeros(len(values), np.float64)
            for i, v in big:
                hi[i], lo[i] = number_key(v)
            p.numbers.append(np.array(slots, np.int64), (hi, lo))
            if p.numbers.needs_merge():
                p.numbers.merge(live)
        for path, (slots, codes) in coded.items():
            p = paths[path]
            p.coded.append(np.array(slots, np.int64), (np.array(codes, np.int32),))
            if p.coded.needs_merge():
                p.coded.merge(live)
        self.count = first_slot + len(metadatas)

    def nbytes(self) -> int:
        """Bytes of the numpy columns (the dictionaries of distinct values not counted)."""
        return sum(p.numbers.nbytes() + p.coded.nbytes() for p in self._paths.values())

    # reads ------------------------------------------------------------------------------------------

    def mask(self, node: Node, n: int) -> np.ndarray:
        """Which of slots [0, n) match `node` (n <= count when it was read); dead slots included."""
        if isinstance(node, And):
            out = self.mask(node.children[0], n)
            for child in node.children[1:]:
                out &= self.mask(child, n)
            return out
        if isinstance(node, Or):
            out = self.mask(node.children[0], n)
            for child in node.children[1:]:
                out |= self.mask(child, n)
            return out
        return self._field(node, n)

    def _field(self, node: Field, n: int) -> np.ndarray:
        p = self._paths.get(node.keys)
        out = None
        for op, arg in node.tests:
            if op in ("$eq", "$ne", "$in", "$nin"):
                values = arg if op in ("$in", "$nin") else (arg,)
                m = self._equal(p, values, n)
                if op in ("$ne", "$nin"):
                    np.logical_not(m, out=m)
            else:
                m = self._range(p, op, arg, n)
            out = m if out is None else np.logical_and(out, m, out=out)
        if out is None:
            raise ValueError(f"filter on {node.path!r} with no tests")  # parse_filter makes at least one
        return out

    def _equal(self, p: _Path | None, values: tuple, n: int) -> np.ndarray:
        mask = _Mask(n)
        if p is None:
            return mask.done()
        numeric = [number_key(v) for v in values if kind(v) == "number"]
        if numeric:
            s_slots, s_keys, t_slots, (t_hi, t_lo), t_n, bound, _ = p.numbers.state
            mask.fit(bound)
            for key in numeric:
                mask.set(s_slots[_bound(s_keys, key, "left"): _bound(s_keys, key, "right")])
            hit = np.zeros(t_n, bool)
            for lo in {lo for _, lo in numeric}:  # lo is 0 but for ints beyond 2**53
                his = [hi for hi, x in numeric if x == lo]
                hit |= (t_hi[:t_n] == his[0] if len(his) == 1 else np.isin(t_hi[:t_n], his)) & (t_lo[:t_n] == lo)
            mask.set(t_slots[:t_n][hit])
        others = [v for v in values if kind(v) in _CODED]
        if others:
            s_slots, (s_codes,), t_slots, (t_codes,), t_n, bound, dictionary = p.coded.state
            codes, _ = _dictionary(dictionary)
            wanted = sorted({c for v in others if (c := codes.get(v)) is not None})
            if wanted:
                mask.fit(bound)
                starts = np.searchsorted(s_codes, wanted, "left")
                ends = np.searchsorted(s_codes, wanted, "right")
                for a, b in zip(starts.tolist(), ends.tolist()):
                    mask.set(s_slots[a:b])
                tail = t_codes[:t_n]
                hit = tail == wanted[0] if len(wanted) == 1 else np.isin(tail, wanted)
                mask.set(t_slots[:t_n][hit])
        return mask.done()

    def _range(self, p: _Path | None, op: str, arg: Any, n: int) -> np.ndarray:
        mask = _Mask(n)
        if p is None:
            return mask.done()
        s_slots, s_keys, t_slots, t_keys, t_n, bound, _ = p.numbers.state
        mask.fit(bound)
        key = number_key(arg)
        if op in ("$gt", "$gte"):
            mask.set(s_slots[_bound(s_keys, key, "right" if op == "$gt" else "left"):])
        else:
            mask.set(s_slots[: _bound(s_keys, key, "left" if op == "$lt" else "right")])
        less, equal = _compare(tuple(k[:t_n] for k in t_keys), key)
        hit = {"$gt": ~(less | equal), "$gte": ~less, "$lt": less, "$lte": less | equal}[op]
        mask.set(t_slots[:t_n][hit])
        return mask.done()


class _Mask:
    """A boolean mask over slots [0, n), sized to cover every slot a column may hold (a column read
    after `n` may hold newer ones); cut to n at the end."""

    def __init__(self, n: int):
        self.n = n
        self.array = np.zeros(n, bool)

    def fit(self, bound: int) -> None:
        if bound > len(self.array):
            grown = np.zeros(bound, bool)
            grown[: len(self.array)] = self.array
            self.array = grown

    def set(self, slots: np.ndarray) -> None:
        if len(slots):
            self.array[slots] = True

    def done(self) -> np.ndarray:
        return self.array[: self.n] if len(self.array) > self.n else self.array
