"""The vector cache of an API process: a text seen before is answered without tokenising, IPC or the engine.

Keyed by everything that makes a text's vector: the served model (its name, the export's name, the graph's
sha256, variant and device), the prompt text put before the text, truncation (on or off, and its side), whether
the vector is normalised, and the text itself. Matryoshka's `dimensions` and the output types (int8, binary,
base64) are cut and converted from the full float vector after the cache, so one entry serves every one of them.

It lives in the API process, keyed by the request's text before tokenisation: a hit skips tokenisation, the
engine's socket round trip and its queue, which an engine-side cache would still pay (RESULTS.md, "The server's
own CPU": a request through an idle engine process costs more than a whole request's CPU in the API process).
Each API process has its own, so a hot text is embedded once per process.

A hit returns the bits a miss returned: the engine's vector of a text is the same in any batch
(tests/test_backend_onnx.py), and the cache keeps a copy of that row. A request's texts that miss go to the
engine together (each distinct text once), and the answer keeps the request's order. The size bound is in
bytes: the vector, the key's strings, and the bookkeeping per entry.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, cast

import numpy as np

from service.ipc.messages import EmbedResult, ModelInfo
from service.metrics import ApiMetrics

#: bytes an entry costs beyond its row's bytes object, its text and its scope: the key and entry tuples and the
#: dict's slot, with room for the dict's spare capacity (tests/test_cache.py holds the bound to traced memory)
ENTRY_OVERHEAD = 256


class Entry(NamedTuple):
    row: bytes  # the vector's float32 bytes, its own memory (a view would keep the whole answer alive)
    tokens: int  # the text's tokens as the engine embedded it (after its prompt and truncation): usage reports it
    nbytes: int  # what the entry counts against the bound


class Scope(NamedTuple):
    """What makes a text's vector besides the text."""

    name: str  # the name requests give the model: a reload empties its entries
    model: str  # the export's name
    sha256: str  # of the graph that makes the vectors
    variant: str
    device: str
    prompt: str  # the text put before each input ("" none)
    truncate: bool
    direction: str  # "right" | "left"
    normalize: bool


def scope_of(name: str, info: ModelInfo, prompt: str, truncate: bool, direction: str, normalize: bool) -> Scope:
    return Scope(name, info.model, info.graph_sha256 or str(info.manifest.get("onnx_sha256", "")), info.variant,
                 info.device, prompt, truncate, direction, normalize)


#: embeds the distinct texts the cache lacks; gives their result and each one's token count
EmbedMissing = Callable[[list[str], list[int]], Awaitable[tuple[EmbedResult, np.ndarray]]]


class VectorCache:
    """A bounded LRU of text vectors, shared by the models of one API process. `max_bytes` 0: off.

    The LRU is an OrderedDict (a hit moves its key to the end, eviction pops the front) with the bytes counted here:
    cachetools' LRUCache is the same OrderedDict with a size function, at several times the cost per text in
    Python-level bookkeeping, which the API process's per-text budget on a GPU notices."""

    def __init__(self, max_bytes: int, metrics: ApiMetrics | None = None):
        self.max_bytes = max(0, int(max_bytes))
        self.metrics = metrics
        self.nbytes = 0
        self._entries: OrderedDict[tuple[Scope, str], Entry] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()  # the event loop's thread uses it; a thread that calls embed must not race
        self._counters: dict[str, tuple] = {}  # model name → (its hit counter, its miss counter)

    @property
    def on(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    async def embed(self, scope: Scope, texts: Sequence[str], embed_missing: EmbedMissing) -> EmbedResult:
        """Every text's vector in order: the cache's where it holds one, else from `embed_missing` (called once,
        with the distinct missing texts and the request position of each; not called when every text hits)."""
        entries = self._entries
        found: list[Entry | None] = []
        with self._lock:
            for text in texts:
                entry = entries.get((scope, text))
                if entry is not None:
                    entries.move_to_end((scope, text))  # the most recently used now
                found.append(entry)
        missing: dict[str, int] = {}  # distinct missing text → its position in the request
        for i, entry in enumerate(found):
            if entry is None and texts[i] not in missing:
                missing[texts[i]] = i
        misses = found.count(None)
        self._count(scope.name, len(texts) - misses, misses)
        if not missing:
            hits = cast(list[Entry], found)  # every text hit
            vectors = np.frombuffer(bytearray(b"".join(e.row for e in hits)), dtype=np.float32).reshape(len(texts), -1)
            tokens = [e.tokens for e in hits]
            return EmbedResult(vectors, sum(tokens), 0.0, 0.0, row_tokens=np.array(tokens, dtype=np.int64))
        result, lengths = await embed_missing(list(missing), list(missing.values()))
        tokens = lengths.tolist()
        rows = self._store(scope, list(missing), result.vectors, tokens)
        if len(missing) == len(texts):  # nothing hit, no text twice: the engine's answer as it is
            return result
        fresh = {text: (row, n) for text, row, n in zip(missing, rows, tokens)}
        parts = [(entry.row, entry.tokens) if entry is not None else fresh[text] for text, entry in zip(texts, found)]
        vectors = np.frombuffer(bytearray(b"".join(p[0] for p in parts)), dtype=np.float32).reshape(len(texts), -1)
        counts = [p[1] for p in parts]
        return EmbedResult(vectors, sum(counts), result.queue_s, result.inference_s, result.tokenization_s,
                           row_tokens=np.array(counts, dtype=np.int64))

    def _store(self, scope: Scope, texts: list[str], vectors: np.ndarray, tokens: list[int]) -> list[bytes]:
        """Keep each text's row (evicting the least recently used past the bound); the rows, in order."""
        data = np.ascontiguousarray(vectors, dtype=np.float32).tobytes()
        width = len(data) // len(texts)
        rows = [data[i:i + width] for i in range(0, len(data), width)]  # each its own bytes
        fixed = ENTRY_OVERHEAD + sys.getsizeof(scope) + sys.getsizeof(scope.prompt) + sys.getsizeof(rows[0])
        entries, limit = self._entries, self.max_bytes
        with self._lock:
            for text, row, n in zip(texts, rows, tokens):
                nbytes = fixed + sys.getsizeof(text)
                if nbytes > limit:
                    continue
                old = entries.pop((scope, text), None)  # another request stored it meanwhile
                if old is not None:
                    self.nbytes -= old.nbytes
                entries[scope, text] = Entry(row, n, nbytes)
                self.nbytes += nbytes
            while self.nbytes > limit:
                self.nbytes -= entries.popitem(last=False)[1].nbytes
        self._gauge()
        return rows

    def drop(self, name: str) -> int:
        """Forget every vector of the model served as `name` (a reload serves another graph under it)."""
        with self._lock:
            keys = [key for key in self._entries if key[0].name == name]
            for key in keys:
                self.nbytes -= self._entries.pop(key).nbytes
        self._gauge()
        return len(keys)

    def _count(self, name: str, hits: int, misses: int) -> None:
        if self.metrics is None:
            return
        counters = self._counters.get(name)
        if counters is None:
            counters = self._counters[name] = (self.metrics.cache_hits.labels(name),
                                               self.metrics.cache_misses.labels(name))
        if hits:
            counters[0].inc(hits)
        if misses:
            counters[1].inc(misses)

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.cache_bytes.set(self.nbytes)
            self.metrics.cache_entries.set(len(self._entries))
