"""The metadata filter language of /search and delete-by-filter, checked once and parsed into a tree.

    {"lang": "en"}                              equality (shorthand for {"lang": {"$eq": "en"}})
    {"year": {"$gte": 2020, "$lt": 2024}}        ranges: $gt $gte $lt $lte, on numbers
    {"tag": {"$in": ["a", "b"]}}                 membership: $in $nin, lists of scalars
    {"lang": {"$ne": "de"}}                      inequality
    {"$or": [{...}, {...}]}, {"$and": [...]}     combinations; several keys in one object are ANDed
    {"source.kind": "web"}                       a dotted path reaches into nested objects

Values compare by JSON type: true is not 1, "1" is not 1 (1 and 1.0 are the same number). A document
without the field matches $ne and $nin and nothing else; so does a field holding a list or an object,
which equals no scalar and is no number. Filters apply before ranking, so a search returns the k best
matching documents (or all matching ones, when fewer match), never a short list.

`parse_filter` checks a filter and returns its tree (`And`, `Or`, `Field`); `compile_filter` turns the
tree into a Python predicate over one document's metadata. The predicate is the reference semantics
(MilvusIndex post-filters with it, the tests compare against it); LocalIndex evaluates the same tree
as numpy masks over its metadata index (metadata.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.index.base import InvalidRequest

Predicate = Callable[[dict[str, Any]], bool]
COMPARISONS = ("$gt", "$gte", "$lt", "$lte")
OPERATORS = ("$eq", "$ne", "$in", "$nin", *COMPARISONS)
MAX_DEPTH = 8
MAX_CLAUSES = 64
MAX_IN = 1024
MISSING = object()  # what a path that does not exist in a document reads as


@dataclass(frozen=True)
class Field:
    """Tests on the value at one path, all of which must hold: (operator, argument) pairs, the argument
    checked (a scalar; a tuple of scalars for $in and $nin; a number for the comparisons)."""

    path: str
    keys: tuple[str, ...]
    tests: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class And:
    children: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    children: tuple[Node, ...]


Node = Field | And | Or


def parse_filter(spec: Any) -> Node:
    """The checked tree of `spec`; InvalidRequest names what is wrong with it."""
    return _node(spec, 1, [0])


def compile_filter(spec: Any) -> Predicate:
    """A predicate over a document's metadata; InvalidRequest names what is wrong with `spec`."""
    return predicate(parse_filter(spec))


def kind(v: Any) -> str:
    """The JSON type a value compares as: bool, number, str, NoneType (or a type no filter value has)."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return type(v).__name__


def lookup(metadata: dict[str, Any], keys: tuple[str, ...]) -> Any:
    value: Any = metadata
    for k in keys:
        value = value.get(k, MISSING) if isinstance(value, dict) else MISSING
        if value is MISSING:
            break
    return value


# --- checking ------------------------------------------------------------------------------------
def _node(spec: Any, depth: int, counter: list[int]) -> Node:
    if depth > MAX_DEPTH:
        raise InvalidRequest(f"filter is nested deeper than {MAX_DEPTH} levels")
    if not isinstance(spec, dict) or not spec:
        raise InvalidRequest("a filter is a non-empty JSON object")
    parts: list[Node] = []
    for key, value in spec.items():
        counter[0] += 1
        if counter[0] > MAX_CLAUSES:
            raise InvalidRequest(f"filter has more than {MAX_CLAUSES} clauses")
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise InvalidRequest(f"{key} takes a non-empty list of filters")
            subs = tuple(_node(v, depth + 1, counter) for v in value)
            parts.append(And(subs) if key == "$and" else Or(subs))
        elif key.startswith("$"):
            raise InvalidRequest(f"unknown filter operator {key!r} at the top of a clause; use a field name, "
                                 f"$and or $or")
        else:
            parts.append(_field(key, value))
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def _field(path: str, cond: Any) -> Field:
    keys = path.split(".")
    if not all(keys):
        raise InvalidRequest(f"invalid field path {path!r}")
    if not (isinstance(cond, dict) and cond and all(isinstance(k, str) and k.startswith("$") for k in cond)):
        cond = {"$eq": cond}
    return Field(path, tuple(keys), tuple((op, _argument(path, op, arg)) for op, arg in cond.items()))


def _scalar(path: str, op: str, arg: Any) -> Any:
    if isinstance(arg, (dict, list)):
        raise InvalidRequest(f"filter {path}: {op} takes a string, number, boolean or null")
    if isinstance(arg, float) and arg != arg:
        raise InvalidRequest(f"filter {path}: {op} takes a finite number")
    return arg


def _argument(path: str, op: str, arg: Any) -> Any:
    if op in ("$eq", "$ne"):
        return _scalar(path, op, arg)
    if op in ("$in", "$nin"):
        if not isinstance(arg, list) or not arg or len(arg) > MAX_IN:
            raise InvalidRequest(f"filter {path}: {op} takes a list of 1 to {MAX_IN} values")
        return tuple(_scalar(path, op, a) for a in arg)
    if op in COMPARISONS:
        if isinstance(arg, bool) or not isinstance(arg, (int, float)) or arg != arg:
            raise InvalidRequest(f"filter {path}: {op} takes a number")
        return arg
    raise InvalidRequest(f"filter {path}: unknown operator {op!r}; use one of {', '.join(OPERATORS)}")


# --- the reference predicate -----------------------------------------------------------------------
def predicate(node: Node) -> Predicate:
    if isinstance(node, And):
        subs = [predicate(c) for c in node.children]
        return lambda m: all(p(m) for p in subs)
    if isinstance(node, Or):
        subs = [predicate(c) for c in node.children]
        return lambda m: any(p(m) for p in subs)
    keys, tests = node.keys, [_test(op, arg) for op, arg in node.tests]
    return lambda m: all(t(v) for v in (lookup(m, keys),) for t in tests)


def _same(a: Any, b: Any) -> bool:
    return a is not MISSING and kind(a) == kind(b) and a == b


def _test(op: str, arg: Any) -> Callable[[Any], bool]:
    if op == "$eq":
        return lambda v: _same(v, arg)
    if op == "$ne":
        return lambda v: not _same(v, arg)
    if op in ("$in", "$nin"):
        def member(v: Any) -> bool:
            return any(_same(v, a) for a in arg)

        return member if op == "$in" else (lambda v: not member(v))
    compare = {"$gt": lambda v: v > arg, "$gte": lambda v: v >= arg,
               "$lt": lambda v: v < arg, "$lte": lambda v: v <= arg}[op]
    return lambda v: kind(v) == "number" and compare(v)
