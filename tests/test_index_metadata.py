"""The metadata index (service/index/metadata.py) against the reference predicate (filters.compile_filter).

Random documents with mixed-type metadata (missing fields, nested objects, bools, ints, floats, strings,
null, lists, keys with dots, ints past 2**53) and random filters (every operator, nested $and/$or, values
of every JSON type, numbers no document holds): the slots a Collection allows must be exactly the live
documents the predicate accepts, after every round of upserts that replace documents and deletes, with
the merge thresholds lowered so the sorted parts, the tails, merges and code renumbering all take part.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from service.index import metadata
from service.index.base import CollectionSpec, Document, InvalidRequest
from service.index.collection import Collection
from service.index.filters import compile_filter, parse_filter
from service.index.metadata import MetadataIndex, number_key

BIG = 2**53
NUMBERS = [0, 1, -1, 2, 3, 7, 1.0, 2.0, 0.5, -0.0, -2.5, 1e300, -1e300, BIG, BIG + 1, BIG - 1, BIG + 2,
           float(BIG), -BIG - 1, 2**62, 2**63 - 1, -(2**63), 9.223372036854776e18, 3.14159]
SCALARS = [*NUMBERS, True, False, None, "1", "a", "b", "", "true", "None", "é", "a.b"]
PROBES = [*SCALARS, "s1", "s2", "s299", 4, 2.5, 10**30, -(10**30), float("inf"), float("-inf"), BIG + 3, 2**63, "zz",
          2**1100]
FIELDS = ["x", "y", "z", "n.k", "n.m", "n.deep.v", "a.b", "missing"]


def random_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if r < 0.08 and depth < 3:
        return {k: random_value(rng, depth + 1) for k in rng.sample(["k", "m", "deep", "v"], rng.randint(0, 3))}
    if r < 0.13:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if r < 0.16:
        return rng.randint(-(2**63), 2**63 - 1)
    if r < 0.20:
        return rng.uniform(-10, 10)
    if r < 0.45:
        return f"s{rng.randrange(1000)}"  # many distinct strings: dictionaries renumbered as documents die
    return rng.choice(SCALARS)


def random_metadata(rng: random.Random) -> dict:
    md = {}
    for key in ("x", "y", "z"):
        if rng.random() < 0.75:
            md[key] = random_value(rng)
    if rng.random() < 0.5:
        md["n"] = {k: random_value(rng) for k in rng.sample(["k", "m", "deep"], rng.randint(0, 3))}
        if rng.random() < 0.3:
            md["n"]["deep"] = {"v": random_value(rng)}
    if rng.random() < 0.2:
        md["a.b"] = random_value(rng)  # unreachable: the filter path a.b means {"a": {"b": ...}}
    if rng.random() < 0.2:
        md["a"] = {"b": random_value(rng)} if rng.random() < 0.7 else random_value(rng)
    return md


def random_condition(rng: random.Random):
    if rng.random() < 0.3:
        return rng.choice(PROBES[:-1])  # equality shorthand (2**1100 only in ranges)
    cond = {}
    for op in rng.sample(["$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte"], rng.randint(1, 2)):
        if op in ("$in", "$nin"):
            cond[op] = [rng.choice(PROBES[:-1]) for _ in range(rng.randint(1, 5))]
        elif op in ("$eq", "$ne"):
            cond[op] = rng.choice(PROBES[:-1])
        else:
            cond[op] = rng.choice([p for p in PROBES if isinstance(p, (int, float)) and not isinstance(p, bool)])
    return cond


def random_filter(rng: random.Random, depth: int = 0) -> dict:
    r = rng.random()
    if depth < 3 and r < 0.3:
        return {rng.choice(["$and", "$or"]): [random_filter(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    spec = {rng.choice(FIELDS): random_condition(rng)}
    if rng.random() < 0.2:
        spec[rng.choice(FIELDS)] = random_condition(rng)
    return spec


def expected_ids(docs: dict[str, dict], spec: dict) -> list[str]:
    predicate = compile_filter(spec)
    return sorted(i for i, md in docs.items() if predicate(md))


@pytest.fixture
def small_merges(monkeypatch):
    monkeypatch.setattr(metadata, "MERGE_MIN", 16)
    monkeypatch.setattr(metadata, "MERGE_SHARE", 2)


@pytest.mark.parametrize("seed", range(4))
def test_masks_equal_the_predicate_through_upserts_replacements_and_deletes(small_merges, seed):
    rng = random.Random(seed)
    collection = Collection(CollectionSpec("c", 2, "Flat"), background=False)
    docs: dict[str, dict] = {}
    next_id = 0
    filters = [random_filter(rng) for _ in range(150)]
    for round_ in range(10):
        batch = {}
        for _ in range(rng.choice([1, 5, 60, 400, 400])):  # new documents, and existing ones replaced
            doc_id = f"d{rng.randrange(next_id)}" if next_id and rng.random() < 0.3 else f"d{next_id}"
            next_id += doc_id == f"d{next_id}"
            batch[doc_id] = random_metadata(rng)
        collection.upsert([Document(i, "", md) for i, md in batch.items()], np.ones((len(batch), 2), np.float32))
        docs.update(batch)
        if docs and round_ % 2:
            gone = rng.sample(sorted(docs), k=min(len(docs), rng.choice([1, 40, len(docs) * 3 // 4])))
            assert collection.delete(gone) == len(gone)
            for i in gone:
                del docs[i]
        for spec in filters:
            assert sorted(collection.ids_matching(spec)) == expected_ids(docs, spec), spec


def test_values_at_the_edges_of_float_precision_compare_as_python_does():
    values = [BIG - 1, BIG, BIG + 1, BIG + 2, float(BIG), float(BIG + 2), 2**63 - 1, -(2**63), 9.223372036854776e18,
              -9.223372036854776e18, 0, -0.0, 0.0, 1, 1.0, True, 1e-300, -1e-300]
    index = MetadataIndex()
    index.add(0, [{"v": v} for v in values], np.ones(len(values), bool))
    for arg in [*values, BIG + 3, 2**63, 2**64, 10**400, -(10**400), float("inf"), float("-inf"), 0.5]:
        for op in ("$gt", "$gte", "$lt", "$lte", "$eq", "$ne"):
            if op in ("$gt", "$gte", "$lt", "$lte") and isinstance(arg, bool):
                continue
            spec = {"v": {op: arg}}
            got = np.flatnonzero(index.mask(parse_filter(spec), len(values))).tolist()
            want = [i for i, v in enumerate(values) if compile_filter(spec)({"v": v})]
            assert got == want, spec


def test_number_keys_order_as_the_numbers_do():
    values = sorted({BIG - 1, BIG, BIG + 1, BIG + 2, 2**63 - 1, -(2**63), -BIG - 1, 0, 5, 2**1100, -(2**1100)})
    keys = [number_key(v) for v in values]
    assert keys == sorted(keys)
    assert number_key(BIG + 1) != number_key(float(BIG + 1)) and number_key(1) == number_key(1.0)


def test_a_merge_drops_dead_slots_and_renumbers_unused_codes(small_merges):
    index = MetadataIndex()
    live = np.ones(11_001, bool)
    index.add(0, [{"s": f"v{i}", "k": i} for i in range(5000)], live)  # 5000 distinct strings
    live[:4900] = False
    index.add(5000, [{"s": "v4999", "k": 1}], live)
    index.add(5001, [{"s": "new", "k": 2}] * 6000, live)  # tail past the threshold: a merge
    column = index._paths[("s",)].coded
    sorted_slots, _, _, _, tail, _, (codes, values) = column.state
    assert tail == 0 and len(sorted_slots) == 100 + 1 + 6000  # the dead 4900 are gone
    assert len(values) == 101 and set(codes) == {f"v{i}" for i in range(4900, 5000)} | {"new"}
    mask = index.mask(parse_filter({"s": {"$in": ["v4999", "v1", "new"]}}), 11_001)
    assert np.flatnonzero(mask & live).tolist() == [4999, 5000, *range(5001, 11_001)]


def test_a_reader_bounds_its_mask_to_the_slots_it_was_given():
    index = MetadataIndex()
    index.add(0, [{"x": 1}] * 10, np.ones(20, bool))
    index.add(10, [{"x": 1}] * 10, np.ones(20, bool))
    assert index.mask(parse_filter({"x": 1}), 10).tolist() == [True] * 10  # as a search that read count = 10
    assert index.mask(parse_filter({"x": {"$ne": 1}}), 10).tolist() == [False] * 10


@pytest.mark.parametrize("bad,message", [
    ({"i": {"$regex": "x"}},
     "filter i: unknown operator '$regex'; use one of $eq, $ne, $in, $nin, $gt, $gte, $lt, $lte"),
    ({"$not": {"i": 1}}, "unknown filter operator '$not' at the top of a clause; use a field name, $and or $or"),
    ({"i": {"$gt": "a"}}, "filter i: $gt takes a number"),
    ({"i": {"$in": []}}, "filter i: $in takes a list of 1 to 1024 values"),
    ({"$or": []}, "$or takes a non-empty list of filters"),
    ({"i": {"$eq": [1]}}, "filter i: $eq takes a string, number, boolean or null"),
    ({"a..b": 1}, "invalid field path 'a..b'"),
    ([], "a filter is a non-empty JSON object"),
])
def test_the_checks_and_their_messages_are_unchanged(bad, message):
    collection = Collection(CollectionSpec("c", 2, "Flat"), background=False)
    with pytest.raises(InvalidRequest) as e:
        collection.ids_matching(bad)
    assert str(e.value) == message
