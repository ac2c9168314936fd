"""MilvusIndex: the VectorIndex contract on a Milvus server or Milvus Lite (a local `.db` path).

The service stays stateless: Milvus holds vectors, texts, metadata and every collection's settings,
so several replicas behind a load balancer share one store. Layout in Milvus:

- a collection `docs` is the alias `sembed_docs` on a physical collection `sembed__<8 hex>__docs`
  (physical names start with the prefix and `_`, aliases with the prefix and a letter: they never
  collide). Fields: `id` VARCHAR primary key, `vector` FLOAT_VECTOR (metric IP), `text` VARCHAR,
  `metadata` JSON. Its spec lives in the collection properties (`sembed.index_type`,
  `sembed.model_name`, `sembed.model_sha256`, `sembed.sequence`), so any replica can read it.
- replace_collection and clear fill a fresh physical collection, then move the alias onto it in one
  call (alter_alias) and drop the old one: readers see the old or the new collection, never neither.
  While a rebuild runs, the old collection is marked (`sembed.frozen`) and writes are refused.
- every read and write names the physical collection it resolved from the alias (pymilvus caches
  schemas by name; a physical name never changes its schema), with Strong consistency: a read after
  an acknowledged write sees it.

Filters: filters.compile_filter is the reference. The filter is also translated into a Milvus
expression over the JSON field that is a *superset* of it (only $eq, $in and ranges on plain keys
are pushed down; $ne/$nin and anything Milvus could read differently — type-strict equality, a
missing field, non-trivial keys, numbers beyond 2**53 — are left to the exact Python predicate).
Search post-filters Milvus's candidates with the predicate and widens the candidate pool until k
documents pass or Milvus has no more; an ANN index that comes back short is answered by an exact
scan of the matching documents, so a filtered search is never silently short. Values are written as
escaped literals; a string or key that cannot be written safely is simply not pushed down.

Sequence numbers: a write's sequence is a hybrid logical clock: the wall clock in microseconds,
taken after Milvus acknowledged the write, but never below this process's last sequence + 1 nor the
collection's stored `sembed.sequence` + 1. So it increases across writes, restarts, a clock that
steps back, and (with synchronised clocks) replicas; it stays below 2**53, exact in JSON clients
(Milvus's own 64-bit TSO would not be, and MilvusClient does not return a mutation's timestamp).

Index types (the FAISS factory strings of LocalIndex): Flat → FLAT, HNSW<M> → HNSW (M,
efConstruction; ef at search), IVF<n>,SQ8 → IVF_SQ8 (nlist; nprobe), IVF<n>,PQ<m> → IVF_PQ (m, 8
bits). Milvus Lite has no product quantisation (it accepts IVF_PQ, then fails building a segment):
there IVF<n>,PQ<m> is built as IVF_SQ8 with the same nlist, and info() still reports the spec asked.

Quantization (`sembed.quantization`): int8 maps to Milvus's own int8 indexes, HNSW<M> → HNSW_SQ
(SQ8, with Milvus's FP32 refine where the server has it: refine_k = oversample) and Flat → IVF_SQ8
with one list (a scan of int8 codes); search asks for k × oversample candidates with their stored
float vectors and rescores them here, so scores are exact cosines on every Milvus (Milvus Lite
builds HNSW_SQ and IVF_SQ8 but ignores refine). binary is refused: Milvus Lite stores no
BINARY_VECTOR, and Milvus's binary indexes (BIN_FLAT, BIN_IVF_FLAT) rank by Hamming distance over a
field of their own, with no float rescoring.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import uuid
from typing import Any, Literal, overload

import numpy as np

from service.index.base import (
    CollectionExists,
    CollectionInfo,
    CollectionNotFound,
    CollectionSpec,
    Document,
    Hit,
    InvalidRequest,
    ModelStamp,
    NotDurable,
    Record,
    SearchParams,
    SparseRows,
    VectorIndexError,
    WriteResult,
)
from service.index.filters import compile_filter
from service.index.validation import check_collection_name, check_id, check_metadata, check_vectors
from service.index.vectors import (
    DEFAULT_EF_SEARCH,
    DEFAULT_NPROBE,
    DEFAULT_OVERSAMPLE,
    MAX_EF_SEARCH,
    check_oversample,
    check_quantization,
    parse_index_type,
)

log = logging.getLogger("sembed.index.milvus")

MAX_TEXT_BYTES = 65_535  # Milvus's largest VARCHAR
MAX_TOPK = 16_384  # Milvus's largest limit for one search
WRITE_CHUNK = 1_000  # rows per upsert/delete/get call (gRPC messages stay small)
MAX_PUSHDOWN_IN = 256  # $in lists longer than this are checked in Python only
FREEZE_TTL_S = 3_600.0  # a rebuild that died leaves its mark; writes resume after this
SAFE_NUMBER = 2**53  # numbers every Milvus reads exactly, as int64 or as double
_SAFE_KEY = re.compile(r"^[A-Za-z0-9_\-:@]{1,128}$")  # JSON keys written into an expression as they are
_SAFE_STRING = re.compile(r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$")  # no control characters but \t \n \r
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_P = "sembed."  # property keys



class _QuietNotFound(logging.Filter):
    """pymilvus logs every failed call with a traceback; a missing collection is an ordinary 404 here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "code=100," not in record.getMessage()[:400]


logging.getLogger("pymilvus.decorators").addFilter(_QuietNotFound())

# Milvus Lite serves a `.db` path from a thread of this process: shared by every MilvusIndex on it,
# released when the last one closes (so a later open of the same file can take its lock).
_lite_lock = threading.Lock()
_lite_users: dict[str, int] = {}


# ---- filters: a superset in Milvus's expression language ------------------------------------------


def to_expression(spec: dict[str, Any] | None, field: str = "metadata") -> str | None:
    """A Milvus boolean expression every document matching `spec` satisfies (a superset), or None
    when nothing can be pushed down. Raises InvalidRequest for a bad filter, as compile_filter does."""
    if spec is None:
        return None
    compile_filter(spec)  # the reference: refuses what the filter language refuses
    return _expr_node(spec, field)


def _expr_node(spec: dict[str, Any], field: str) -> str | None:
    parts: list[str | None] = []
    for key, value in spec.items():
        if key == "$and":
            parts.append(_join([_expr_node(v, field) for v in value], "and"))
        elif key == "$or":
            subs = [_expr_node(v, field) for v in value]
            parts.append(None if any(s is None for s in subs) else _join(subs, "or"))
        else:
            parts.append(_expr_field(key, value, field))
    return _join(parts, "and")


def _join(parts: list[str | None], op: str) -> str | None:
    """AND drops clauses it cannot push down (a superset still); callers make OR give up instead."""
    kept = [p for p in parts if p is not None]
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else "(" + f" {op} ".join(kept) + ")"


def _expr_field(path: str, cond: Any, field: str) -> str | None:
    keys = path.split(".")
    if not all(_SAFE_KEY.match(k) for k in keys):
        return None
    target = field + "".join(f'["{k}"]' for k in keys)
    if not (isinstance(cond, dict) and cond and all(isinstance(k, str) and k.startswith("$") for k in cond)):
        cond = {"$eq": cond}
    parts = []
    for op, arg in cond.items():
        if op == "$eq":
            parts.append(_equals(target, arg))
        elif op == "$in":
            terms: list[str | None] = [_equals(target, a) for a in arg] if len(arg) <= MAX_PUSHDOWN_IN else [None]
            parts.append(None if any(t is None for t in terms) else _join(terms, "or"))
        elif op in ("$gt", "$gte", "$lt", "$lte"):
            literal = _number(arg)
            # >= and <= even for > and <: a Milvus that compares as doubles may round a large stored
            # integer onto the bound, and rounding never moves a value across a non-strict bound.
            parts.append(None if literal is None else f"{target} {'>=' if op in ('$gt', '$gte') else '<='} {literal}")
        else:  # $ne, $nin: Milvus drops documents without the field; the predicate keeps them
            parts.append(None)
    return _join(parts, "and")


def _equals(target: str, value: Any) -> str | None:
    if value is None:
        return f"{target} is null"  # also a missing field: a superset
    literal = _literal(value)
    return None if literal is None else f"{target} == {literal}"


def _literal(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _number(value)
    if isinstance(value, str):
        return quote(value)
    return None


def _number(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) > SAFE_NUMBER:
            return None
        if value.is_integer():
            value = int(value)
    if abs(value) > SAFE_NUMBER:
        return None
    return repr(value)  # repr of a float reads back as the same double


def quote(value: str) -> str | None:
    """A double-quoted Milvus string literal for `value`, or None when it holds control characters
    that not every Milvus parser accepts (the filter is then checked in Python only)."""
    if not _SAFE_STRING.match(value):
        return None
    return '"' + "".join(_ESCAPES.get(c, c) for c in value) + '"'


# ---- the index ------------------------------------------------------------------------------------


class MilvusIndex:
    def __init__(self, uri: str, token: str | None = None, db_name: str | None = None, prefix: str = "sembed_",
                 timeout: float | None = 30.0, product_quantization: bool | None = None,
                 oversample: int = DEFAULT_OVERSAMPLE):
        try:
            from pymilvus import MilvusClient
        except ImportError as e:  # pragma: no cover - an install without the extra
            raise RuntimeError("the milvus backend needs the `milvus` extra: pip install 'sembed[milvus]'") from e
        if not uri:
            raise ValueError("the milvus backend needs a URI (SEMBED_MILVUS_URI): http://host:19530 or a .db path")
        if not re.match(r"^[A-Za-z][A-Za-z0-9_]{0,31}$", prefix):
            raise ValueError(f"invalid collection prefix {prefix!r}")
        self.uri, self.prefix, self.timeout = uri, prefix, timeout
        check_oversample(oversample)
        self.oversample = oversample  # int8 collections: candidates rescored per hit, unless a search says
        self._lite = uri.endswith(".db") and "://" not in uri
        self.product_quantization = (not self._lite) if product_quantization is None else product_quantization
        self._seq_lock = threading.Lock()
        self._last_seq = 0
        kwargs: dict[str, Any] = {"uri": uri}
        if token:
            kwargs["token"] = token
        if db_name:
            kwargs["db_name"] = db_name
        if self._lite:
            with _lite_lock:
                self._client = MilvusClient(**kwargs)
                _lite_users[uri] = _lite_users.get(uri, 0) + 1
        else:
            self._client = MilvusClient(**kwargs)
        self._closed = False

    # the VectorIndex interface --------------------------------------------------------------------

    def create_collection(self, spec: CollectionSpec, exist_ok: bool = False) -> CollectionInfo:
        self._check_spec(spec)
        current = self._describe(spec.name, missing_ok=True)
        if current is not None:
            if exist_ok and _dimension(current) == spec.dimension:
                return self._info(spec.name, current)
            raise CollectionExists(f"collection {spec.name!r} exists (dimension {_dimension(current)}, "
                                   f"{_props(current).get(_P + 'index_type')})")
        physical = self._create_physical(spec, self._next_sequence(0))
        try:
            self._call(self._client.create_alias, physical, self._alias(spec.name))
        except VectorIndexError:
            self._drop_physical(physical)
            current = self._describe(spec.name, missing_ok=True)  # another replica created it first
            if current is not None and exist_ok and _dimension(current) == spec.dimension:
                return self._info(spec.name, current)
            raise CollectionExists(f"collection {spec.name!r} exists") from None
        return self.info(spec.name)

    def drop_collection(self, name: str) -> WriteResult:
        desc = self._describe(name)
        count = self._count(desc["collection_name"])
        seq = self._next_sequence(_sequence(desc))
        self._call(self._client.drop_alias, self._alias(name), write=True)
        self._drop_physical(desc["collection_name"])
        return WriteResult(count, seq, 0)

    def list_collections(self) -> list[CollectionInfo]:
        infos = []
        for physical in sorted(self._call(self._client.list_collections)):
            if not physical.startswith(self.prefix + "_"):
                continue
            try:
                aliases = self._call(self._client.list_aliases, physical).get("aliases", [])
            except CollectionNotFound:
                continue
            for alias in aliases:
                name = alias[len(self.prefix):]
                if alias.startswith(self.prefix) and physical.endswith("__" + name):
                    try:
                        infos.append(self.info(name))
                    except CollectionNotFound:
                        pass
        return sorted(infos, key=lambda i: i.name)

    def info(self, name: str) -> CollectionInfo:
        return self._info(name, self._describe(name))

    def upsert(self, name: str, documents: list[Document], vectors: np.ndarray,
               sparse: SparseRows | None = None) -> WriteResult:
        if sparse is not None:  # no collection here keeps them (_check_spec)
            raise InvalidRequest(f"collection {name!r} keeps no sparse vectors")
        desc = self._describe_for_write(name)
        self._upsert_rows(desc, documents, vectors)
        return self._written(desc, len(documents))

    def get(self, name: str, ids: list[str], with_vector: bool = False) -> list[Record]:
        for i in ids:
            check_id(i)
        desc = self._describe(name)
        fields = ["id", "text", "metadata"] + (["vector"] if with_vector else [])
        found = {r["id"]: r for r in self._get_rows(desc["collection_name"], list(dict.fromkeys(ids)), fields)}
        return [Record(i, found[i].get("text", ""), found[i].get("metadata") or {},
                       _vector(found[i]) if with_vector else None) for i in ids if i in found]

    def delete(self, name: str, ids: list[str] | None = None, filter: dict[str, Any] | None = None) -> WriteResult:
        if (ids is None) == (filter is None):
            raise InvalidRequest("delete takes either ids or a filter")
        if ids is not None:
            for i in ids:
                check_id(i)
        predicate = compile_filter(filter) if filter is not None else None
        desc = self._describe_for_write(name)
        physical = desc["collection_name"]
        if ids is not None:  # Milvus counts the ids it was given, not the documents it removed
            doomed = [r["id"] for r in self._get_rows(physical, list(dict.fromkeys(ids)), ["id"])]
        elif predicate is not None:
            doomed = [r["id"] for batch in self._iterate(physical, ["id", "metadata"], to_expression(filter))
                      for r in batch if predicate(r.get("metadata") or {})]
        for start in range(0, len(doomed), WRITE_CHUNK):
            self._call(self._client.delete, physical, ids=doomed[start: start + WRITE_CHUNK], write=True)
        return self._written(desc, len(doomed))

    def clear(self, name: str) -> WriteResult:
        desc = self._describe_for_write(name)
        count = self._count(desc["collection_name"])
        result = self._swap_in(name, desc, self._spec_of(name, desc), [])
        return WriteResult(count, result.sequence, 0)

    def search(self, name: str, queries: np.ndarray | None, params: SearchParams) -> list[list[Hit]]:
        desc = self._describe(name)
        dimension, physical = _dimension(desc), desc["collection_name"]
        if params.mode != "dense":
            raise InvalidRequest(f"search mode {params.mode!r} needs a lexical index or sparse vectors, which the "
                                 "milvus backend does not keep: use mode 'dense', or the local index "
                                 "(docs/hybrid-search.md)")
        queries = check_vectors(queries, -1 if queries is None else len(queries), dimension)
        if params.k < 1:
            raise InvalidRequest("k must be at least 1")
        if not len(queries):
            return []
        kind = parse_index_type(_props(desc).get(_P + "index_type", "Flat"), dimension)
        check_oversample(params.oversample)
        quantized = _props(desc).get(_P + "quantization", "none") != "none"
        if params.ef_search is not None and not params.k <= params.ef_search <= MAX_EF_SEARCH:
            raise InvalidRequest(f"ef_search must be between k ({params.k}) and {MAX_EF_SEARCH}")
        if params.nprobe is not None and not 1 <= params.nprobe <= max(kind.nlist, 1):
            raise InvalidRequest(f"nprobe must be between 1 and the number of IVF lists ({kind.nlist})")
        predicate = compile_filter(params.filter) if params.filter is not None else None
        expr = to_expression(params.filter)
        fields = (["text"] if params.with_text else []) + (["metadata"] if params.with_metadata or predicate else []) \
            + (["vector"] if params.with_vector or quantized else [])
        results: list[list[Hit]] = [[] for _ in range(len(queries))]
        states = ["more"] * len(queries)
        pending = list(range(len(queries)))
        want = params.k * (params.oversample or self.oversample) if quantized else params.k
        limit = min(MAX_TOPK, want if predicate is None else max(2 * want, want + 16))
        returned = [0] * len(queries)  # candidates Milvus gave each query
        while True:
            raw = self._search_raw(physical, queries[pending], limit, expr, fields, kind, params, quantized)
            for q, rows in zip(pending, raw):
                if quantized:
                    rows = _rescored(queries[q], rows)
                results[q], states[q] = _select(rows, predicate, params, limit)
                returned[q] = len(rows)
            pending = [q for q in pending if states[q] == "more"]
            if not pending or limit >= MAX_TOPK:
                break
            limit = min(MAX_TOPK, limit * 4)
        # Still short: the filter dropped too many of Milvus's largest candidate list, or an ANN index
        # ran out of candidates before every matching document was seen. An exact scan answers those.
        short = [q for q, state in enumerate(states) if state == "more"
                 or (state == "exhausted" and kind.kind != "flat" and len(results[q]) < params.k)]
        if short:
            matching = self._count(physical, expr)
            short = [q for q in short if matching > returned[q]]
        if short:
            for q, hits in zip(short, self._exact_search(physical, queries[short], expr, predicate, params)):
                results[q] = hits
        return results

    def scan(self, name: str, batch: int = 1000):
        desc = self._describe(name)
        for rows in self._iterate(desc["collection_name"], ["id", "text", "metadata"], None, batch):
            yield [Record(r["id"], r.get("text", ""), r.get("metadata") or {}) for r in rows]

    def replace_collection(self, spec: CollectionSpec, batches) -> WriteResult:
        """Fill a new physical collection from (documents, vectors) batches, then move the alias onto it."""
        self._check_spec(spec)
        desc = self._describe_for_write(spec.name)
        return self._swap_in(spec.name, desc, spec, batches)

    def flush(self, name: str) -> None:
        """Seal what was written into segments, so their index is built (Milvus does it on its own too)."""
        self._call(self._client.flush, self._describe(name)["collection_name"])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._client.close()
        finally:
            if self._lite:
                with _lite_lock:
                    _lite_users[self.uri] -= 1
                    if _lite_users[self.uri] <= 0:
                        del _lite_users[self.uri]
                        from milvus_lite.server_manager import server_manager_instance

                        server_manager_instance.release_server(self.uri)

    # collections ---------------------------------------------------------------------------------

    def _alias(self, name: str) -> str:
        return self.prefix + check_collection_name(name)

    def _check_spec(self, spec: CollectionSpec) -> None:
        check_collection_name(spec.name)
        if spec.lexical:
            raise InvalidRequest("lexical indexes (search modes lexical and hybrid) are not available on the milvus "
                                 "backend: create the collection without lexical, or use the local index")
        if spec.sparse_model is not None:
            raise InvalidRequest("sparse vectors (sparse_model: search modes sparse and hybrid) are not available on "
                                 "the milvus backend: create the collection without sparse_model, or use the local "
                                 "index")
        if not isinstance(spec.dimension, int) or not 1 <= spec.dimension <= 32_768:
            raise InvalidRequest(f"dimension must be between 1 and 32768 (Milvus's limit), not {spec.dimension}")
        if check_quantization(spec.quantization, parse_index_type(spec.index_type, spec.dimension)) == "binary":
            raise InvalidRequest("quantization 'binary' is not available on the milvus backend (Milvus Lite stores "
                                 "no binary vectors, and Milvus's binary indexes cannot rescore with the float "
                                 "vectors): use 'int8' (HNSW_SQ, or IVF_SQ8 for Flat) or 'none', or the local "
                                 "backend")

    def _index_params(self, spec: CollectionSpec):
        from pymilvus.milvus_client.index import IndexParam, IndexParams

        kind = parse_index_type(spec.index_type, spec.dimension)
        build: dict[str, Any]
        if spec.quantization == "int8" and kind.kind == "flat":  # one list: a scan of every int8 code
            index_type, build = "IVF_SQ8", {"nlist": 1}
        elif spec.quantization == "int8":
            index_type, build = "HNSW_SQ", {"M": kind.hnsw_m, "efConstruction": kind.ef_construction,
                                            "sq_type": "SQ8", "refine": True, "refine_type": "FP32"}
        elif kind.kind == "flat":
            index_type, build = "FLAT", {}
        elif kind.kind == "hnsw":
            index_type, build = "HNSW", {"M": kind.hnsw_m, "efConstruction": kind.ef_construction}
        elif kind.pq_m and self.product_quantization:
            index_type, build = "IVF_PQ", {"nlist": kind.nlist, "m": kind.pq_m, "nbits": 8}
        else:  # IVF<n>,SQ8, and IVF<n>,PQ<m> where PQ is missing (Milvus Lite)
            index_type, build = "IVF_SQ8", {"nlist": kind.nlist}
        class LiteIndexParam(IndexParam):
            """pymilvus 3 sends build parameters as flat key-value pairs; Milvus Lite 3.2 reads only the older JSON
            "params" pair and would silently build with its defaults (nlist 128, M 16): this one sends both (its
            own configs: pymilvus has no public way to add the pair)."""

            def __init__(self, *args: Any, **kwargs: Any):
                super().__init__(*args, **kwargs)
                self._configs["params"] = dict(build)

        kind_of_param = LiteIndexParam if self._lite and build else IndexParam
        return IndexParams([kind_of_param("vector", index_type, "vector", metric_type="IP", params=build)])

    def _create_physical(self, spec: CollectionSpec, sequence: int) -> str:
        from pymilvus import DataType, MilvusClient

        physical = f"{self.prefix}_{uuid.uuid4().hex[:8]}__{spec.name}"
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False,
                                            description=f"sembed collection {spec.name}")
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=256)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=spec.dimension)
        schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
        schema.add_field("metadata", DataType.JSON)
        props = {_P + "index_type": spec.index_type, _P + "sequence": str(sequence),
                 _P + "quantization": spec.quantization}
        if spec.model:
            props.update({_P + "model_name": spec.model.name, _P + "model_sha256": spec.model.sha256})
        self._call(self._client.create_collection, physical, schema=schema, consistency_level="Strong",
                   properties=props, write=True)
        try:
            # sync=False: the index is declared on an empty collection; Milvus builds it per sealed segment
            self._call(self._client.create_index, physical, self._index_params(spec), sync=False, write=True)
            # pymilvus's own wait for a load polls every half second; poll faster (Lite loads at once)
            self._call(self._client.load_collection, physical, _async=True, write=True)
            self._wait_loaded(physical)
        except BaseException:
            self._drop_physical(physical)
            raise
        return physical

    def _wait_loaded(self, physical: str) -> None:
        from pymilvus.client.types import LoadState

        deadline, pause = time.monotonic() + (self.timeout or 300.0), 0.005
        while self._call(self._client.get_load_state, physical)["state"] != LoadState.Loaded:
            if time.monotonic() > deadline:
                raise NotDurable(f"milvus did not load collection {physical!r} in time")
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def _drop_physical(self, physical: str) -> None:
        try:
            self._call(self._client.drop_collection, physical, write=True)
        except CollectionNotFound:
            pass

    def _swap_in(self, name: str, desc: dict, spec: CollectionSpec, batches) -> WriteResult:
        old = desc["collection_name"]
        self._set_props(old, {_P + "frozen": repr(time.time() + FREEZE_TTL_S)})
        physical = None
        try:
            physical = self._create_physical(spec, _sequence(desc))
            new = self._call(self._client.describe_collection, physical)
            seen = 0
            for documents, vectors in batches:
                self._set_props(old, {_P + "frozen": repr(time.time() + FREEZE_TTL_S)})
                self._upsert_rows(new, documents, vectors)
                seen += len(documents)
            seq = self._next_sequence(_sequence(desc))
            self._set_props(physical, {_P + "sequence": str(seq)})
            self._call(self._client.alter_alias, physical, self._alias(name), write=True)
        except BaseException:
            if physical is not None:
                self._drop_physical(physical)
            try:
                self._set_props(old, {_P + "frozen": "0"})
            except VectorIndexError:
                log.warning("could not unfreeze %s after a failed rebuild", old)
            raise
        self._drop_physical(old)
        return WriteResult(seen, seq, self._count(physical))

    def _upsert_rows(self, desc: dict, documents: list[Document], vectors: np.ndarray) -> None:
        """Check every document (nothing is written when one is refused), then upsert them in chunks."""
        chunked = next((d.id for d in documents if d.chunks is not None), None)
        if chunked is not None:
            raise InvalidRequest(f"document {chunked!r} is chunked, and the milvus backend stores one vector per "
                                 "document: send it with chunking false (its text is then truncated), or use the "
                                 "local index (docs/long-documents.md)")
        vectors = check_vectors(vectors, len(documents), _dimension(desc))
        rows, seen = [], set()
        for d, v in zip(documents, vectors):
            check_id(d.id)
            check_metadata(d.metadata, f"metadata of {d.id!r}")
            if d.id in seen:
                raise InvalidRequest(f"document id {d.id!r} appears twice in one write")
            seen.add(d.id)
            text = d.text or ""
            if not isinstance(text, str):
                raise InvalidRequest(f"text of {d.id!r} must be a string")
            if len(text.encode()) > MAX_TEXT_BYTES:
                raise InvalidRequest(f"text of {d.id!r} is over {MAX_TEXT_BYTES} bytes, the most a Milvus "
                                     f"VARCHAR holds")
            rows.append({"id": d.id, "vector": v.tolist(), "text": text, "metadata": d.metadata})
        for start in range(0, len(rows), WRITE_CHUNK):
            self._call(self._client.upsert, desc["collection_name"], rows[start: start + WRITE_CHUNK], write=True)

    def _spec_of(self, name: str, desc: dict) -> CollectionSpec:
        props = _props(desc)
        model = None
        if props.get(_P + "model_name") is not None:
            model = ModelStamp(props[_P + "model_name"], props.get(_P + "model_sha256", ""))
        return CollectionSpec(name, _dimension(desc), props.get(_P + "index_type", "Flat"), model,
                              props.get(_P + "quantization", "none"))

    def _info(self, name: str, desc: dict) -> CollectionInfo:
        spec = self._spec_of(name, desc)
        return CollectionInfo(name, spec.dimension, spec.index_type, spec.model, self._count(desc["collection_name"]),
                              _sequence(desc), self._ann_ready(desc["collection_name"], spec), spec.quantization)

    def _ann_ready(self, physical: str, spec: CollectionSpec) -> bool:
        if spec.index_type == "Flat" and spec.quantization == "none":
            return True
        try:
            index = self._call(self._client.describe_index, physical, "vector")
        except VectorIndexError:
            return False
        return bool(index) and not int(index.get("pending_index_rows", 0) or 0)

    @overload
    def _describe(self, name: str, missing_ok: Literal[False] = False) -> dict: ...

    @overload
    def _describe(self, name: str, missing_ok: bool) -> dict | None: ...

    def _describe(self, name: str, missing_ok: bool = False) -> dict | None:
        if missing_ok and not self._call(self._client.has_collection, self._alias(name)):
            return None  # has_collection knows aliases; asking first keeps pymilvus from logging an error
        try:
            return self._call(self._client.describe_collection, self._alias(name))
        except CollectionNotFound:
            if missing_ok:
                return None
            raise CollectionNotFound(f"no collection named {name!r}") from None

    def _describe_for_write(self, name: str) -> dict:
        desc = self._describe(name)
        frozen = float(_props(desc).get(_P + "frozen", "0") or 0)
        if frozen > time.time():
            raise CollectionExists(f"collection {name!r} does not take writes now: it is being rebuilt; retry later")
        return desc

    def _set_props(self, physical: str, props: dict[str, str]) -> None:
        self._call(self._client.alter_collection_properties, physical, properties=props, write=True)

    def _written(self, desc: dict, count: int) -> WriteResult:
        physical = desc["collection_name"]
        seq = self._next_sequence(_sequence(desc))
        self._set_props(physical, {_P + "sequence": str(seq)})
        return WriteResult(count, seq, self._count(physical))

    def _next_sequence(self, stored: int) -> int:
        with self._seq_lock:
            seq = max(time.time_ns() // 1_000, self._last_seq + 1, stored + 1)
            self._last_seq = seq
            return seq

    # reads ---------------------------------------------------------------------------------------

    def _count(self, physical: str, expr: str | None = None) -> int:
        rows = self._call(self._client.query, physical, filter=expr or "", output_fields=["count(*)"],
                          consistency_level="Strong")
        return int(rows[0]["count(*)"]) if rows else 0

    def _get_rows(self, physical: str, ids: list[str], fields: list[str]) -> list[dict]:
        rows = []
        for start in range(0, len(ids), WRITE_CHUNK):
            chunk = ids[start: start + WRITE_CHUNK]
            if chunk:
                rows.extend(self._call(self._client.get, physical, ids=chunk, output_fields=fields,
                                       consistency_level="Strong"))
        return rows

    def _iterate(self, physical: str, fields: list[str], expr: str | None, batch: int = 1000):
        iterator = self._call(self._client.query_iterator, physical, batch_size=max(1, min(batch, 16_384)),
                              filter=expr or "", output_fields=fields, consistency_level="Strong")
        try:
            while True:
                rows = self._call(iterator.next, timeout=False)
                if not rows:
                    return
                yield list(rows)
        finally:
            iterator.close()

    def _search_raw(self, physical: str, queries: np.ndarray, limit: int, expr: str | None, fields: list[str],
                    kind, params: SearchParams, quantized: bool = False) -> list[list[dict]]:
        search: dict[str, Any]
        if kind.kind == "hnsw":
            search = {"ef": min(max(params.ef_search or DEFAULT_EF_SEARCH, limit), max(MAX_EF_SEARCH, limit))}
            if quantized:
                search["refine_k"] = params.oversample or self.oversample
        elif kind.kind == "ivf":
            search = {"nprobe": params.nprobe or min(DEFAULT_NPROBE, kind.nlist)}
        else:
            search = {"nprobe": 1} if quantized else {}
        return self._call(self._client.search, physical, data=queries.tolist(), limit=limit, filter=expr or "",
                          output_fields=fields, search_params={"metric_type": "IP", "params": search},
                          anns_field="vector", consistency_level="Strong")

    def _exact_search(self, physical: str, queries: np.ndarray, expr: str | None, predicate,
                      params: SearchParams) -> list[list[Hit]]:
        """Exact inner product over every document passing the filter, a batch at a time (the answer when
        an ANN index, or Milvus's limit, leaves a search short)."""
        k = params.k
        best_scores = np.full((len(queries), 0), -np.inf, dtype=np.float32)
        best_rows: list[dict] = []
        for batch in self._iterate(physical, ["id", "vector", "text", "metadata"], expr, 4096):
            rows = [r for r in batch if predicate is None or predicate(r.get("metadata") or {})]
            if not rows:
                continue
            vectors = np.asarray([_vector(r) for r in rows], dtype=np.float32)
            scores = np.concatenate([best_scores, queries @ vectors.T], axis=1)
            pool = best_rows + rows
            keep = min(k, len(pool))
            top = np.argsort(-scores, axis=1, kind="stable")[:, :keep]
            # one pool for all queries: keep the union of every query's top k
            union = sorted(set(top.ravel().tolist()))
            best_scores, best_rows = scores[:, union], [pool[i] for i in union]
        results = []
        for row_scores in best_scores:
            order = np.argsort(-row_scores, kind="stable")[:k]
            hits = []
            for i in order.tolist():
                score = float(row_scores[i])
                if params.score_threshold is not None and score < params.score_threshold:
                    break
                hits.append(_hit(best_rows[i], score, params))
            results.append(hits)
        return results

    # errors --------------------------------------------------------------------------------------

    def _call(self, fn, *args, write: bool = False, timeout: bool = True, loaded: bool = False, **kwargs):
        """Call pymilvus, mapping its errors onto the index's. A collection found released (Milvus Lite
        does not keep the load state across a restart) is loaded, and the call made once more."""
        from pymilvus.exceptions import MilvusException

        try:
            return fn(*args, timeout=self.timeout, **kwargs) if timeout else fn(*args, **kwargs)
        except MilvusException as e:
            message = str(getattr(e, "message", "") or e)
            lowered = message.lower()
            code = getattr(e, "code", None)
            if (code == 101 or "call load()" in lowered or "not loaded" in lowered) and not loaded \
                    and args and isinstance(args[0], str):
                self._call(self._client.load_collection, args[0], _async=True, loaded=True)
                self._wait_loaded(args[0])
                return self._call(fn, *args, write=write, timeout=timeout, loaded=True, **kwargs)
            if code == 100 or ("collection" in lowered and any(
                    s in lowered for s in ("not found", "not exist", "can't find"))):
                raise CollectionNotFound(message) from e
            if "already exist" in lowered:
                raise CollectionExists(message) from e
            if write:
                raise NotDurable(f"milvus refused the write: {message}") from e
            raise VectorIndexError(f"milvus: {message}") from e


# ---- helpers --------------------------------------------------------------------------------------


def _props(desc: dict) -> dict[str, str]:
    return desc.get("properties") or {}


def _sequence(desc: dict) -> int:
    try:
        return int(_props(desc).get(_P + "sequence", "0"))
    except ValueError:
        return 0


def _dimension(desc: dict) -> int:
    for f in desc.get("fields", []):
        if f.get("name") == "vector":
            return int(f["params"]["dim"])
    raise VectorIndexError(f"milvus collection {desc.get('collection_name')!r} has no vector field")


def _vector(row: dict) -> list[float]:
    return [float(x) for x in row["vector"]]


def _hit(row: dict, score: float, params: SearchParams) -> Hit:
    text = row.get("text")  # one vector per document here: its one chunk spans its text
    return Hit(row["id"], (text or "") if params.with_text else None,
               (row.get("metadata") or {}) if params.with_metadata else None,
               _vector(row) if params.with_vector else None, score=score, start=None if text is None else 0,
               end=None if text is None else len(text),
               chunks=[(0, len(text), score)] if params.with_chunks and text is not None else None)


def _rescored(query: np.ndarray, rows: list[dict]) -> list[dict]:
    """Milvus's candidates (with their float vectors) ranked by exact inner product, `distance` set to it;
    candidates keep Milvus's order among ties."""
    if not rows:
        return rows
    vectors = np.asarray([(r.get("entity") or {})["vector"] for r in rows], dtype=np.float32)
    scores = vectors @ query
    order = np.argsort(-scores, kind="stable")
    return [dict(rows[i], distance=float(scores[i])) for i in order.tolist()]


def _select(rows: list[dict], predicate, params: SearchParams, limit: int) -> tuple[list[Hit], str]:
    """One query's hits among Milvus's candidates, and why they end: "k" found, the "threshold" was
    passed, Milvus was "exhausted" (fewer candidates than asked), or "more" candidates are needed."""
    hits: list[Hit] = []
    for row in rows:
        score = float(row["distance"])
        if params.score_threshold is not None and score < params.score_threshold:
            return hits, "threshold"
        entity = dict(row.get("entity") or {})
        entity["id"] = row["id"]
        if predicate is not None and not predicate(entity.get("metadata") or {}):
            continue
        hits.append(_hit(entity, score, params))
        if len(hits) == params.k:
            return hits, "k"
    return hits, "exhausted" if len(rows) < limit else "more"

