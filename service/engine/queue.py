"""The batch queue: tokenised requests wait here and leave as forward passes under a token budget.

Modelled on TEI's `core/src/queue.rs`, with three changes for a CPU where one pass can take seconds:
- **fair**: the requests served the fewest tokens so far (then the smallest) fill each pass first,
  each with as many of its rows as the pass takes, so a one-text request arriving behind a
  256-text request runs in the next pass, not after it, and large requests take turns pass by pass;
- **grouped by length**: a row joins a pass only if the pass's padded length stays within
  `max_padding_ratio` times the row's own (the settings' default: 1.25 on a CPU, 2 on a GPU; 2 for a
  request alone in the queue), so short texts are not padded to a long neighbour's length (the
  budget alone would allow 63 short rows at 256 tokens each);
- **bounded**: a request those two rules leave out of two passes leads the next one, so a longer text is not
  kept waiting for as long as shorter ones keep arriving.

A pass holds at most `max_batch_requests` rows and `max_batch_tokens` tokens counted *with*
padding (rows × padded length, the rows too where the backend pads their count to buckets, as on
CUDA), which is what the model computes and what bounds its memory.
Requests whose caller left, or whose deadline passed, are dropped before they reach the model.

**Streams**: on a CPU the engine runs `streams` passes at once, each on its share of the cores (one
pass on every core loses time to the threads' synchronisation after every op; RESULTS.md, "Serving
on a CPU"). Rows that arrive at idle streams are shared among them (two 16-row passes on one core each finish
before one 32-row pass on both); a pass of the queue's one row while no other runs is *wide*: it runs alone on
every core (a lone text gets the latency of all of them), and no other pass starts until it ends.
The queue is shared by the submitting thread (put) and the inference threads (next_batch, done): one lock.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.engine.backends.base import bucketed_rows, padded_length
from service.ipc.messages import TokenBatch

#: a request left out of this many passes leads the next one (two: a one-text request arriving behind a large
#: one that has not started yet still goes first, as the least served)
MAX_PASSED_OVER = 2
#: the padding ratio for a request alone in the queue (see _select)
LONE_PADDING_RATIO = 2.0


@dataclass(eq=False)
class Job:
    """One request's texts. The inference thread fills rows and calls `on_done` once, from an engine thread."""

    batch: TokenBatch
    dimension: int
    deadline: float  # time.monotonic()
    on_done: Callable[[Job], object]
    context: Any = None  # the submitter's own: whom to answer
    normalize: bool = True  # which of a pass's two outputs the request wants: only that one is kept
    token_states: bool = False  # TEI's /embed_all: every row's token states, end to end ([tokens, dimension]), instead
    vectors: np.ndarray = field(init=False)
    error: BaseException | None = None
    cancelled: bool = False  # the caller left: rows not yet run are dropped
    enqueued_at: float = 0.0
    scheduled_at: float | None = None  # when its first row entered a pass
    inference_s: float = 0.0  # time spent in passes that carried its rows
    served_tokens: int = 0
    passed_over: int = 0  # passes formed while it waited that took none of its rows
    size: int = field(init=False)  # rows
    _order: np.ndarray | None = field(init=False)  # row indices, shortest first (None: already in that order)
    _scheduled: TokenBatch = field(init=False)  # the rows in that order: a pass's share is one slice of it
    _sorted: list[int] = field(init=False)  # the rows' lengths in that order
    _cumulative: list[int] = field(init=False)  # tokens of the first k rows in that order
    _cursor: int = 0
    _pending: int = field(init=False)
    # passes on two streams may fill the same job at once, and the queue may fail it meanwhile (its deadline)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    prompt_tokens: int = field(init=False)
    _finished: bool = False

    def __post_init__(self) -> None:
        # whole-array work here, so no step of the engine needs a Python object per row
        n = self.size = len(self.batch)
        self._order, self._scheduled = None, self.batch
        if n == 1:  # most requests under load: no array work at all
            length = int(self.batch.offsets[1] - self.batch.offsets[0])
            self._sorted, self._cumulative = [length], [0, length]
        else:
            lengths = self.batch.lengths
            if (lengths[1:] < lengths[:-1]).any():
                self._order = np.argsort(lengths, kind="stable")
                self._scheduled = self.batch.take(self._order)
                lengths = lengths[self._order]
            self._sorted = lengths.tolist()
            self._cumulative = [0, *np.cumsum(lengths).tolist()]
        self.vectors = np.empty((self.batch.tokens if self.token_states else n, self.dimension), dtype=np.float32)
        self._pending = n
        self.prompt_tokens = self._cumulative[-1]

    @property
    def finished(self) -> bool:
        return self._finished

    # --- scheduling: the queue's view (rows in scheduling order, shortest first) -----------------------
    @property
    def scheduled(self) -> int:
        """Rows already put in passes: the next pass's share starts at this scheduling position."""
        return self._cursor

    @property
    def unscheduled(self) -> int:
        return self.size - self._cursor

    @property
    def sorted_lengths(self) -> list[int]:
        """Each row's length in scheduling order (ascending; not a copy: read it, never change it)."""
        return self._sorted

    def schedule(self, n: int, now: float) -> tuple[Job, int, int]:
        """The next `n` rows go in a pass formed `now`: this job's part of it, (job, start, n)."""
        start = self._cursor
        self._cursor += n
        self.served_tokens += self.tokens(start, n)
        if self.scheduled_at is None:
            self.scheduled_at = now
        return self, start, n

    def rows(self, start: int, n: int) -> TokenBatch:
        """The rows at scheduling positions start.. as a backend takes them (views)."""
        return self._scheduled.slice(start, start + n)

    def longest(self, start: int, n: int) -> int:
        return self._sorted[start + n - 1]  # scheduling order is shortest first

    def tokens(self, start: int, n: int) -> int:
        return self._cumulative[start + n] - self._cumulative[start]

    def fill(self, start: int, normalized: np.ndarray, raw: np.ndarray, states: np.ndarray | None = None,
             seconds: float = 0.0) -> None:
        """The vectors of the rows at scheduling positions start.. (one pass's share of this job, the pass taking
        `seconds`); a token job's from `states` [n, seq, dimension], each row's real tokens."""
        vectors = normalized if self.normalize else raw
        n = len(vectors)
        if self.token_states:
            self._fill_tokens(start, n, states)
        elif self._order is None:
            self.vectors[start:start + n] = vectors
        else:
            self.vectors[self._order[start:start + n]] = vectors
        with self._lock:
            self.inference_s += seconds
            self._pending -= n
            done = self._pending == 0
        if done:
            self._finish()

    def _fill_tokens(self, start: int, n: int, states: np.ndarray | None) -> None:
        if states is None:
            raise RuntimeError("a token job's rows ran without the token output")
        offsets = self.batch.offsets
        rows = range(start, start + n) if self._order is None else self._order[start:start + n]
        for k, (row, length) in enumerate(zip(rows, self._sorted[start:start + n])):
            first = int(offsets[row])
            self.vectors[first:first + length] = states[k, :length]

    def fail(self, error: BaseException) -> None:
        if not self._finished:
            self.error = error
            self._finish()

    def _finish(self) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
        self.on_done(self)


@dataclass
class Batch:
    """One forward pass: from each job, rows at consecutive scheduling positions (start, count), so a job's
    share of the pass is one slice of the output (the runner pads the rows to their longest)."""

    parts: list[tuple[Job, int, int]]
    wide: bool = False  # alone: on every core, no other pass meanwhile (see Streams above)


class BatchQueue:
    def __init__(self, max_batch_tokens: int, max_batch_requests: int, pad_to_multiple_of: int,
                 max_seq_length: int, deadline_error: type[Exception] = TimeoutError,
                 row_buckets: tuple[int, ...] = (), max_padding_ratio: float = 2.0, streams: int = 1):
        if padded_length(max_seq_length, pad_to_multiple_of) > max_batch_tokens:
            raise ValueError(f"max_batch_tokens={max_batch_tokens} cannot hold one input of the model's "
                             f"max_seq_length ({max_seq_length})")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        self.pad_to_multiple_of = pad_to_multiple_of
        self.row_buckets = row_buckets
        self.max_padding_ratio = max_padding_ratio  # a row may be padded to this many times its own length
        self.deadline_error = deadline_error  # what a job whose deadline passed in the queue fails with
        self._cond = threading.Condition()
        self._jobs: list[Job] = []
        self._closed = False
        self.streams = streams  # passes that may run at once (see Streams above)
        self._waiting = 0  # inference threads asleep on _cond
        self._running = 0  # passes handed out and not yet done
        self._wide_running = False
        self._row_limits: dict[int, int] = {}  # padded length → rows the budget allows (rows_within)
        self._queued_tokens = 0  # every queued request's tokens not yet in a pass (cancelled ones until dropped)

    # --- the submitting side -------------------------------------------------------------------
    def put(self, job: Job) -> None:
        job.enqueued_at = time.monotonic()
        with self._cond:
            self._jobs.append(job)
            self._queued_tokens += job.prompt_tokens
            if self._waiting:  # a busy inference thread looks again after its pass: no wake-up per request
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def queued_rows(self) -> int:
        with self._cond:
            return sum(j.unscheduled for j in self._jobs)

    @property
    def queued_tokens(self) -> int:
        """The tokens of every queued request not yet in a pass: all the work ahead of a new request, at most."""
        return self._queued_tokens

    def remaining_tokens(self) -> list[int]:
        """Each queued request's tokens not yet in a pass: what admission weighs a new request against."""
        with self._cond:
            return [j.prompt_tokens - j.served_tokens for j in self._jobs]

    def rows_within(self, seq_len: int) -> int:
        """The most rows a pass padded to `seq_len` may hold under the token budget, rows as the backend pads
        them (bucketed) counted."""
        if (known := self._row_limits.get(seq_len)) is not None:
            return known
        rows = self.max_batch_tokens // seq_len
        while rows > 0 and bucketed_rows(rows, self.row_buckets) * seq_len > self.max_batch_tokens:
            rows -= 1
        self._row_limits[seq_len] = rows
        return rows

    # --- inference-thread side ------------------------------------------------------------------
    def next_batch(self) -> Batch | None:
        """Block until a pass can be formed (and no wide pass runs); None once the queue is closed and empty.
        Every pass handed out is given back with `done` once it has run."""
        with self._cond:
            while True:
                self._drop_dead(time.monotonic())
                if self._jobs and not self._wide_running:
                    break
                if not self._jobs and self._closed:
                    return None
                self._waiting += 1
                self._cond.wait()
                self._waiting -= 1
            # Idle streams and rows for more than one: the rows are shared among the streams (two passes on one thread
            # each finish before one on both; RESULTS.md, "Serving on a CPU"); a lone row runs wide
            share = None
            if self.streams > 1 and not self._running and (rows := sum(j.unscheduled for j in self._jobs)) > 1:
                share = -(-rows // self.streams)
            batch = self._select(share)
            batch.wide = self._wide_running = self.streams > 1 and not self._running and not self._jobs
            self._running += 1
            if self._jobs and self._waiting:  # more than this pass waits: another stream can start one
                self._cond.notify()
            return batch

    def done(self, batch: Batch) -> None:
        """`batch`'s pass has run: its stream is free again (after a wide pass, every stream is)."""
        with self._cond:
            self._running -= 1
            if batch.wide:
                self._wide_running = False
            if self._waiting:
                self._cond.notify()

    def _drop_dead(self, now: float) -> None:
        alive = []
        for job in self._jobs:
            if job.cancelled or job.finished:
                continue
            if now > job.deadline:
                job.fail(self.deadline_error("the request's deadline passed while it waited in the queue"))
                continue
            alive.append(job)
        self._jobs = alive
        if not alive:
            self._queued_tokens = 0

    def _select(self, row_cap: int | None = None) -> Batch:
        # Least-served job first, then the smallest (a one-text request is not held a pass behind a large one
        # that arrived just before it), then the oldest; each puts in as many of its next rows as the pass still
        # takes (the first row always fits: see __init__). A job's rows are sorted by length, so each run of rows
        # padded to one length joins or stops as a whole: steps per distinct length, not per row.
        jobs = sorted(self._jobs, key=lambda j: (j.served_tokens, j.prompt_tokens, j.enqueued_at))
        # That order alone starves: while shorter texts keep coming, a longer one is never first, and the padding
        # ratio keeps it out of every pass they lead (as the row cap would keep it out of passes they fill). A job
        # passed over MAX_PASSED_OVER times leads the next pass (the oldest such first): every wait is bounded.
        due = [job for job in jobs if job.passed_over >= MAX_PASSED_OVER]
        if due:
            leader = min(due, key=lambda j: j.enqueued_at)
            jobs.remove(leader)
            jobs.insert(0, leader)
        taken: dict[Job, int] = {}
        multiple, cap = self.pad_to_multiple_of, min(self.max_batch_requests, row_cap or self.max_batch_requests)
        # A request alone in the queue: the rows a tight ratio leaves out make passes of their own, with nothing else
        # to group them with, so each pass's fixed cost is paid for less padding saved: the loose ratio.
        ratio = self.max_padding_ratio if len(jobs) > 1 else max(self.max_padding_ratio, LONE_PADDING_RATIO)
        rows = seq_len = shortest = 0
        for job in jobs:
            if rows == cap:
                break
            lengths, position = job.sorted_lengths, job.scheduled
            while position < job.size and rows < cap:
                own = padded_length(lengths[position], multiple)
                new_len = max(seq_len, own)
                new_short = min(shortest, own) if rows else own
                room = self.rows_within(new_len) - rows
                if rows and (room <= 0 or new_len > ratio * new_short):
                    break  # this job's later rows are longer still: it is done for this pass
                same_length = bisect.bisect_right(lengths, own, position) - position
                n = max(1, min(same_length, cap - rows, room))
                rows, position, seq_len, shortest = rows + n, position + n, new_len, new_short
                if n < same_length:
                    break  # the pass is full
            if position > job.scheduled:
                taken[job] = position - job.scheduled
        now = time.monotonic()
        parts = [job.schedule(n, now) for job, n in taken.items()]
        for job in self._jobs:
            if job not in taken:
                job.passed_over += 1
        self._jobs = [j for j in self._jobs if j.unscheduled]
        self._queued_tokens = sum(j.prompt_tokens - j.served_tokens for j in self._jobs)
        return Batch(parts)
