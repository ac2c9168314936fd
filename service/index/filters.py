"""The metadata filter language of /search and delete-by-filter, checked once and compiled.

    {"lang": "en"}                              equality (shorthand for {"lang": {"$eq": "en"}})
    {"year": {"$gte": 2020, "$lt": 2024}}        ranges: $gt $gte $lt $lte, on numbers
    {"tag": {"$in": ["a", "b"]}}                 membership: $in $nin, lists of scalars
    {"lang": {"$ne": "de"}}                      inequality
    {"$or": [{...}, {...}]}, {"$and": [...]}     combinations; several keys in one object are ANDed
    {"source.kind": "web"}                       a dotted path reaches into nested objects

Values compare by JSON type: true is not 1, "1" is not 1. A document without the field matches
$ne and $nin and nothing else. Filters apply before ranking, so a search returns the k best
matching documents (or all matching ones, when fewer match), never a short list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.index.base import InvalidRequest

Predicate = Callable[[dict[str, Any]], bool]
COMPARISONS = ("$gt", "$gte", "$lt", "$lte")
OPERATORS = ("$eq", "$ne", "$in", "$nin", *COMPARISONS)
MAX_DEPTH = 8
MAX_CLAUSES = 64
MAX_IN = 1024
_MISSING = object()


def compile_filter(spec: Any) -> Predicate:
    """A predicate over a document's metadata; InvalidRequest names what is wrong with `spec`."""
    counter = [0]
    return _node(spec, 1, counter)


def _node(spec: Any, depth: int, counter: list[int]) -> Predicate:
    if depth > MAX_DEPTH:
        raise InvalidRequest(f"filter is nested deeper than {MAX_DEPTH} levels")
    if not isinstance(spec, dict) or not spec:
        raise InvalidRequest("a filter is a non-empty JSON object")
    parts = []
    for key, value in spec.items():
        counter[0] += 1
        if counter[0] > MAX_CLAUSES:
            raise InvalidRequest(f"filter has more than {MAX_CLAUSES} clauses")
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise InvalidRequest(f"{key} takes a non-empty list of filters")
            subs = [_node(v, depth + 1, counter) for v in value]
            parts.append((lambda m, s=subs: all(p(m) for p in s)) if key == "$and"
                         else (lambda m, s=subs: any(p(m) for p in s)))
        elif key.startswith("$"):
            raise InvalidRequest(f"unknown filter operator {key!r} at the top of a clause; use a field name, "
                                 f"$and or $or")
        else:
            parts.append(_field(key, value))
    return parts[0] if len(parts) == 1 else (lambda m: all(p(m) for p in parts))


def _field(path: str, cond: Any) -> Predicate:
    keys = path.split(".")
    if not all(keys):
        raise InvalidRequest(f"invalid field path {path!r}")
    if not (isinstance(cond, dict) and cond and all(isinstance(k, str) and k.startswith("$") for k in cond)):
        cond = {"$eq": cond}
    tests = [_operator(path, op, arg) for op, arg in cond.items()]

    def predicate(metadata: dict[str, Any]) -> bool:
        value: Any = metadata
        for k in keys:
            value = value.get(k, _MISSING) if isinstance(value, dict) else _MISSING
            if value is _MISSING:
                break
        return all(t(value) for t in tests)

    return predicate


def _scalar(path: str, op: str, arg: Any) -> Any:
    if isinstance(arg, (dict, list)):
        raise InvalidRequest(f"filter {path}: {op} takes a string, number, boolean or null")
    if isinstance(arg, float) and arg != arg:
        raise InvalidRequest(f"filter {path}: {op} takes a finite number")
    return arg


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return type(v).__name__


def _same(a: Any, b: Any) -> bool:
    return a is not _MISSING and _kind(a) == _kind(b) and a == b


def _operator(path: str, op: str, arg: Any) -> Callable[[Any], bool]:
    if op == "$eq":
        arg = _scalar(path, op, arg)
        return lambda v: _same(v, arg)
    if op == "$ne":
        arg = _scalar(path, op, arg)
        return lambda v: not _same(v, arg)
    if op in ("$in", "$nin"):
        if not isinstance(arg, list) or not arg or len(arg) > MAX_IN:
            raise InvalidRequest(f"filter {path}: {op} takes a list of 1 to {MAX_IN} values")
        values = [_scalar(path, op, a) for a in arg]
        def member(v: Any) -> bool:
            return any(_same(v, a) for a in values)

        return member if op == "$in" else (lambda v: not member(v))
    if op in COMPARISONS:
        if isinstance(arg, bool) or not isinstance(arg, (int, float)) or arg != arg:
            raise InvalidRequest(f"filter {path}: {op} takes a number")
        compare = {"$gt": lambda v: v > arg, "$gte": lambda v: v >= arg,
                   "$lt": lambda v: v < arg, "$lte": lambda v: v <= arg}[op]
        return lambda v: _kind(v) == "number" and compare(v)
    raise InvalidRequest(f"filter {path}: unknown operator {op!r}; use one of {', '.join(OPERATORS)}")
