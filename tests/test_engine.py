"""The engine and its queue on the fake backend: budgets, grouping, fairness, limits, failures, order."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from service.api.registry import ModelRegistry
from service.engine.backends import padded_length
from service.engine.backends.fake import FakeBackend
from service.engine.core import Engine, EngineConfig
from service.ipc.messages import (
    InferenceFailed,
    InputTooLong,
    InvalidInput,
    Overloaded,
    QueueDeadline,
)
from tests.conftest import until


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


class Harness:
    """The engine as the routes reach it: texts tokenised by the API side's model entry, then the engine."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.served = ModelRegistry().add_in_process("m", engine)

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def embed(self, texts, **options):
        return await self.served.embed(texts, **options)


def make_engine(**config) -> tuple[Harness, FakeBackend]:
    backend = FakeBackend(max_seq_length=config.pop("max_seq_length", 64), pad_to_multiple_of=8,
                          row_buckets=config.pop("row_buckets", ()))
    return Harness(Engine(backend, EngineConfig.from_settings(**config))), backend


def alone(backend: FakeBackend, text: str) -> np.ndarray:
    batch = backend.tokenize([text])
    return backend.run(batch, padded_length(batch.tokens, backend.pad_to_multiple_of))[0][0]


async def queued(engine, rows: int) -> None:
    """Every request started so far, `rows` texts in all, has been tokenised and queued (its rows hold permits)."""
    await until(lambda: engine.in_flight == rows, what=f"{rows} rows queued (in flight: {engine.in_flight})")


def test_concurrent_requests_get_their_own_rows_bit_for_bit():
    engine, backend = make_engine(max_batch_tokens=512, max_batch_requests=16)
    rng = np.random.default_rng(0)
    requests = [[words(int(rng.integers(1, 60)), f"r{r}t{t}") for t in range(int(rng.integers(1, 6)))]
                for r in range(40)]

    async def run():
        backend.gate.clear()
        tasks = [asyncio.ensure_future(engine.embed(texts)) for texts in requests]
        await queued(engine, sum(map(len, requests)))
        backend.gate.set()
        return await asyncio.gather(*tasks)

    results = asyncio.run(run())
    engine.stop()
    shared_passes = len(backend.passes)
    for texts, result in zip(requests, results):
        expected = np.stack([alone(backend, t) for t in texts])
        assert np.array_equal(result.vectors, expected)  # same bits as each text run on its own
        assert result.prompt_tokens == sum(len(t.split()) + 2 for t in texts)
    assert shared_passes < len(requests)  # and they really shared passes


def test_passes_keep_the_token_budget_the_row_cap_and_similar_lengths():
    engine, backend = make_engine(max_batch_tokens=256, max_batch_requests=10)
    lengths = [1, 3, 5, 9, 14, 20, 30, 45, 60] * 6

    async def run():
        backend.gate.clear()
        tasks = [asyncio.ensure_future(engine.embed([words(n, f"x{i}")])) for i, n in enumerate(lengths)]
        await queued(engine, len(lengths))
        backend.gate.set()
        await asyncio.gather(*tasks)

    asyncio.run(run())
    engine.stop()
    assert sum(map(len, backend.passes)) == len(lengths)
    for rows, padded in zip(backend.passes, backend.padded_tokens):
        assert len(rows) <= 10 and padded <= 256
        pads = [padded_length(n, 8) for n in rows]
        # grouped by length: nobody padded past the ratio (1.25 on a CPU) times its own
        assert max(pads) <= engine.config.max_padding_ratio * min(pads) and engine.config.max_padding_ratio == 1.25
    assert max(map(len, backend.passes)) > 1


def test_a_tighter_padding_ratio_pads_less_and_keeps_every_row_within_it():
    from service.engine.queue import LONE_PADDING_RATIO, BatchQueue, Job
    from service.ipc.messages import TokenBatch

    rng = np.random.default_rng(0)
    lengths = [[int(n) for n in rng.integers(3, 49, 32)] for _ in range(8)]  # eight requests of 32 texts

    def passes(ratio: float, requests: list[list[int]]) -> list[tuple[list[int], bool]]:
        """Each pass's row lengths, and whether its request was alone in the queue when it was formed."""
        queue = BatchQueue(max_batch_tokens=4096, max_batch_requests=64, pad_to_multiple_of=2, max_seq_length=64,
                           max_padding_ratio=ratio)
        jobs = [Job(TokenBatch.from_rows([[7] * n for n in sizes]), 8, float("inf"), lambda job: None)
                for sizes in requests]
        for job in jobs:
            queue.put(job)
        out = []
        while queue.queued_tokens:
            alone = sum(job.unscheduled > 0 for job in jobs) == 1
            out.append(([job.sorted_lengths[start + k] for job, start, n in queue.next_batch().parts
                         for k in range(n)], alone))
        return out

    def padded(rows: list[tuple[list[int], bool]]) -> int:
        return sum(len(p) * max(padded_length(n, 2) for n in p) for p, _ in rows)

    def within(rows: list[int], ratio: float) -> bool:
        return max(padded_length(n, 2) for n in rows) <= ratio * min(padded_length(n, 2) for n in rows)

    loose, tight = passes(2.0, lengths), passes(1.25, lengths)
    for ratio, made in ((2.0, loose), (1.25, tight)):
        assert sorted(n for p, _ in made for n in p) == sorted(n for sizes in lengths for n in sizes)  # each once
        assert all(within(p, LONE_PADDING_RATIO if alone else ratio) for p, alone in made)
    real = sum(map(sum, lengths))
    assert real / padded(tight) > 0.85 > real / padded(loose)  # the padding a pass computes for nothing
    # a request alone in the queue is cut by the loose ratio: no row padded past twice its length, some past 1.25
    alone = passes(1.25, lengths[:1])
    assert all(lone for _, lone in alone) and all(within(p, LONE_PADDING_RATIO) for p, _ in alone)
    assert not all(within(p, 1.25) for p, _ in alone)


def test_with_row_buckets_the_budget_bounds_the_padded_rows():
    """On CUDA a pass's row count is padded to a bucket: the queue counts those rows, so the device never
    computes more than the budget, and a full pass is a bucket's worth of real rows, not a bucket of padding."""
    from service.engine.backends.onnx import CUDA_ROW_BUCKETS

    engine, backend = make_engine(max_batch_tokens=640, max_batch_requests=1024, row_buckets=CUDA_ROW_BUCKETS)
    texts = [words(6, f"s{i}") for i in range(300)] + [words(n, f"l{n}") for n in range(7, 40)]

    async def run():
        backend.gate.clear()
        tasks = [asyncio.ensure_future(engine.embed(texts[i:i + 37])) for i in range(0, len(texts), 37)]
        await queued(engine, len(texts))
        backend.gate.set()
        return await asyncio.gather(*tasks)

    asyncio.run(run())
    engine.stop()
    assert sum(map(len, backend.passes)) == len(texts) and max(backend.padded_tokens) <= 640
    # 8-token rows: 80 fit the budget unpadded, but 80 rows run as 96; 64 rows are a bucket and fit
    assert max(map(len, backend.passes)) == 64


def test_the_pass_timed_at_start_is_one_the_budget_allows_with_its_rows_bucketed():
    from service.engine.backends.onnx import CUDA_ROW_BUCKETS
    from service.engine.core import measure_rate

    engine, backend = make_engine(max_batch_tokens=10000, max_batch_requests=1024, row_buckets=CUDA_ROW_BUCKETS)
    measure_rate(engine.engine)
    # 156 rows of 64 tokens fit 10,000, but run as 192 (12,288 tokens); 128 rows are a bucket that fits
    assert backend.passes[-1] == [64] * 128 and backend.padded_tokens[-1] == 128 * 64
    assert engine.admission.rate is not None and engine.admission.rate > 0


def test_a_small_request_is_not_starved_by_a_huge_one():
    # 256 texts at the length limit, then one short text: it must run in the next pass, not the 17th.
    engine, backend = make_engine(max_batch_tokens=1024, max_batch_requests=64)
    big = [words(200, f"b{i}") for i in range(256)]  # truncated to 64 tokens each: 16 per pass

    async def run():
        backend.gate.clear()
        big_task = asyncio.ensure_future(engine.embed(big))
        await until(backend.at_gate.is_set)  # its first pass is taken, and held at the gate
        small_task = asyncio.ensure_future(engine.embed(["just one"]))
        await queued(engine, len(big) + 1)
        backend.gate.set()
        await big_task
        return await small_task

    small = asyncio.run(run())
    engine.stop()
    small_pass = next(k for k, rows in enumerate(backend.passes) if 4 in rows)  # [CLS] just one [SEP]
    assert small_pass == 1 and len(backend.passes) == 17  # right after the pass that was running
    assert np.array_equal(small.vectors[0], alone(backend, "just one"))
    assert all(p <= 1024 for p in backend.padded_tokens)  # the limit is in tokens, padding included


def test_no_permit_means_an_immediate_overloaded():
    engine, backend = make_engine(max_queued_inputs=4)

    async def run():
        backend.gate.clear()
        held = asyncio.ensure_future(engine.embed(["a", "b", "c"]))
        await until(lambda: engine.in_flight == 3)
        with pytest.raises(Overloaded, match="retry"):
            await engine.embed(["d", "e"])
        with pytest.raises(InvalidInput, match="holds at most 4"):  # never, not 'later'
            await engine.embed(["x"] * 5)
        fits = asyncio.ensure_future(engine.embed(["f"]))
        await queued(engine, 4)
        backend.gate.set()
        await asyncio.gather(held, fits)
        assert engine.in_flight == 0  # permits come back

    asyncio.run(run())
    engine.stop()


def test_rows_past_their_deadline_never_reach_the_model():
    engine, backend = make_engine(request_timeout_s=0.05, max_batch_requests=1)

    async def run():
        backend.gate.clear()
        first = asyncio.ensure_future(engine.embed(["first"]))
        await until(lambda: engine.queue.queued_rows() == 0 and engine.in_flight == 1)
        late = asyncio.ensure_future(engine.embed(["late one", "late two"]))
        await queued(engine, 3)
        # their deadline (0.05 s after they were queued, which was before now) passes while "first" holds the model
        passed = time.monotonic() + 0.05
        await until(lambda: time.monotonic() > passed, what="the late rows' deadline to pass")
        backend.gate.set()
        await first
        with pytest.raises(QueueDeadline):
            await late

    asyncio.run(run())
    engine.stop()
    assert backend.passes == [[3]]  # only "first" ran
    assert engine.in_flight == 0


def test_a_caller_that_leaves_takes_its_rows_out_of_the_queue():
    engine, backend = make_engine(max_batch_requests=4)

    async def run():
        backend.gate.clear()
        blocker = asyncio.ensure_future(engine.embed(["blocker"]))
        await until(lambda: engine.in_flight == 1 and engine.queue.queued_rows() == 0)
        abandoned = [asyncio.ensure_future(engine.embed([words(5, f"a{i}{j}") for j in range(8)])) for i in range(5)]
        await queued(engine, 41)
        for task in abandoned:
            task.cancel()
        await asyncio.gather(*abandoned, return_exceptions=True)
        kept = asyncio.ensure_future(engine.embed(["kept"]))
        backend.gate.set()
        await asyncio.gather(blocker, kept)

    asyncio.run(run())
    engine.stop()
    assert sum(map(len, backend.passes)) == 2  # blocker and kept; none of the 40 abandoned rows
    assert engine.in_flight == 0


def test_a_failing_input_fails_only_its_own_request():
    engine, backend = make_engine(max_batch_requests=32)
    texts = [f"normal request {i}" for i in range(16)]

    async def run():
        backend.gate.clear()
        good = [asyncio.ensure_future(engine.embed([t])) for t in texts]
        bad = asyncio.ensure_future(engine.embed(["this one will FAIL", "with a fine neighbour"]))
        await queued(engine, len(texts) + 2)
        backend.gate.set()
        with pytest.raises(InferenceFailed):
            await bad
        return await asyncio.gather(*good)

    results = asyncio.run(run())
    engine.stop()
    assert sum(map(len, backend.passes)) > 18  # the shared pass failed, then each row ran alone
    for text, result in zip(texts, results):
        assert np.array_equal(result.vectors[0], alone(backend, text))
    assert engine.in_flight == 0


def test_invalid_unicode_is_refused_before_the_queue():
    engine, backend = make_engine()

    async def run():
        with pytest.raises(InvalidInput, match=r"inputs\[1\] is not valid Unicode"):
            await engine.embed(["fine", "bad \ud800 text"])
        return await engine.embed(["fine"])

    assert asyncio.run(run()).vectors.shape == (1, 8)
    engine.stop()
    assert backend.passes == [[3]]


def test_truncate_false_names_the_token_count():
    engine, backend = make_engine(max_seq_length=16)

    async def run():
        with pytest.raises(InputTooLong, match=r"inputs\[0\] has 22 tokens; the model takes at most 16"):
            await engine.embed([words(20)], truncate=False)
        cut = await engine.embed([words(20)], truncate=True)
        assert cut.prompt_tokens == 16
        default = await engine.embed([words(20)])  # auto_truncate
        assert np.array_equal(cut.vectors, default.vectors)

    asyncio.run(run())
    engine.stop()


def test_admission_refuses_by_expected_wait_so_small_requests_still_get_in():
    engine, backend = make_engine(max_queue_wait_s=0.6, max_batch_requests=4)
    engine.admission.observe_pass(100, 1.0)  # 100 tokens/s: a test knows every estimate

    async def run():
        backend.gate.clear()
        big = [asyncio.ensure_future(engine.embed([words(8, f"b{i}{j}") for j in range(4)])) for i in range(2)]
        await queued(engine, 8)
        await until(backend.at_gate.is_set)  # 4 rows (40 tokens) in the pass held at the gate, 40 more queued behind it
        with pytest.raises(Overloaded, match="would wait about 0.8 s") as refused:
            await engine.embed([words(8, f"c{j}") for j in range(4)])  # 40 ahead of it + 40 running: 0.8 s
        small = asyncio.ensure_future(engine.embed(["one"]))  # 3 of those queued + 40 running: 0.43 s, admitted
        await queued(engine, 9)
        backend.gate.set()
        return refused.value, await small, await asyncio.gather(*big)

    refused, small, big = asyncio.run(run())
    engine.stop()
    assert refused.retry_after_s == 1.0 and small.vectors.shape == (1, 8) and len(big) == 2
    assert engine.metrics.rejected._value.get() == 1


def test_an_idle_engine_admits_a_request_however_long_it_takes():
    engine, _ = make_engine(max_queue_wait_s=0.1)
    engine.admission.observe_pass(100, 1.0)  # 30 texts × 12 tokens = 3.6 s of work at 100 tokens/s

    result = asyncio.run(engine.embed([words(10, f"t{i}") for i in range(30)]))
    engine.stop()
    assert result.vectors.shape == (30, 8)


def test_stop_finishes_what_is_queued_then_refuses():
    engine, backend = make_engine()

    async def run():
        results = await asyncio.gather(*(engine.embed([f"text {i}"]) for i in range(5)))
        await asyncio.get_running_loop().run_in_executor(None, engine.stop)
        from service.ipc.messages import NotReady

        with pytest.raises(NotReady):
            await engine.embed(["after stop"])
        return results

    assert len(asyncio.run(run())) == 5


def test_messages_bundled_into_one_come_apart_as_they_went_in():
    from service.ipc.messages import (
        JOIN_BELOW,
        Cancel,
        Embed,
        Failed,
        Overloaded,
        TokenBatch,
        Vectors,
        batch_frames,
        batch_from_frames,
        bundle_replies,
        bundle_requests,
        decode_replies,
        decode_requests,
        encode,
    )

    requests = [(Embed(1, 2), [b"payload"]), (Cancel(2), []), (Embed(3, 1, normalize=False), [b"a", b"", b"c"])]
    frames = bundle_requests(requests)
    assert len(frames) == 2  # small: every header in the first frame, every buffer joined in the second
    parts = decode_requests(frames)
    assert [(m, [bytes(f) for f in b]) for m, b in parts] == [(m, [bytes(f) for f in b]) for m, b in requests]
    cancels = bundle_requests([(Cancel(1), []), (Cancel(2), [])])
    assert len(cancels) == 1 and [m for m, _ in decode_requests(cancels)] == [Cancel(1), Cancel(2)]
    vectors = np.arange(6, dtype="<f4").reshape(2, 3)
    answers = [(Vectors(1, (2, 3), 5, 0.25, 0.5), [vectors.reshape(-1).data]),
               (Failed.of(2, Overloaded("wait", retry_after_s=3.0)), [])]
    parts = decode_replies(bundle_replies(answers))
    assert [m for m, _ in parts] == [m for m, _ in answers]
    assert np.frombuffer(parts[0][1][0], dtype="<f4").tolist() == vectors.reshape(-1).tolist()
    error = parts[1][0].exception()
    assert type(error) is Overloaded and str(error) == "wait" and error.retry_after_s == 3.0
    # large buffers travel as frames of their own, uncopied
    big = np.ones(JOIN_BELOW // 4, dtype="<f4").data
    frames = bundle_replies([(Vectors(1, (1, 1), 1, 0, 0), [b"x"]), (Vectors(2, (1, len(big)), 1, 0, 0), [big])])
    assert len(frames) == 3 and frames[2] is big
    parts = decode_replies(frames)
    assert [m.id for m, _ in parts] == [1, 2] and parts[0][1] == [b"x"] and parts[1][1][0] is big
    single = bundle_requests(requests[:1])  # one message travels as itself
    assert single == encode(Embed(1, 2), b"payload") and decode_requests(single)[0][0] == Embed(1, 2)
    # a token batch crosses as one buffer, with and without type ids, and comes back as views of it
    for types in (None, [[0, 0, 1], [1]]):
        batch = TokenBatch.from_rows([[101, 7, 102], [5]], types)
        (payload,) = batch_frames(batch)
        back = batch_from_frames(2, bytes(payload))
        assert back.ids.tolist() == [101, 7, 102, 5] and back.offsets.tolist() == [0, 3, 4]
        assert (back.type_ids is None) == (types is None) and (types is None or back.type_ids.tolist() == [0, 0, 1, 1])
    with pytest.raises(ValueError, match="2 rows and 4 tokens"):
        batch_from_frames(2, bytes(payload) + b"xx")


def test_large_requests_take_turns_pass_by_pass_and_a_single_still_makes_the_next_pass():
    engine, backend = make_engine(max_batch_tokens=4096, max_batch_requests=8)
    big = {name: [words(3, f"{name}{i}") for i in range(16)] for name in ("a", "b")}

    async def run():
        backend.gate.clear()
        tasks = [asyncio.ensure_future(engine.embed(texts)) for texts in big.values()]
        await until(backend.at_gate.is_set)  # a's first pass is taken, and held at the gate
        await queued(engine, 32)
        single = asyncio.ensure_future(engine.embed(["just one"]))
        await queued(engine, 33)
        backend.gate.set()
        return await asyncio.gather(*tasks, single)

    first, second, single = asyncio.run(run())
    engine.stop()
    # a fills the first pass whole (8 rows); the single (served least) leads the next with 7 of b's rows
    assert [len(rows) for rows in backend.passes] == [8, 8, 8, 8, 1]
    assert backend.passes[1][0] == 4  # [CLS] just one [SEP]
    for texts, result in zip(big.values(), (first, second)):
        assert np.array_equal(result.vectors, np.stack([alone(backend, t) for t in texts]))
    assert np.array_equal(single.vectors[0], alone(backend, "just one"))


def test_requests_sharing_a_pass_keep_the_vectors_they_asked_for():
    engine, backend = make_engine(max_padding_ratio=2.0)  # 4, 7 and 11 tokens (padded to 8 and 16): one pass
    texts = [words(n, "n") for n in (9, 2, 5)]

    async def run():
        backend.gate.clear()
        blocker = asyncio.ensure_future(engine.embed(["blocker"]))
        await until(backend.at_gate.is_set)  # its pass holds the model: the two below queue together
        tasks = [asyncio.ensure_future(engine.embed(texts, normalize=flag)) for flag in (True, False)]
        await queued(engine, 7)
        backend.gate.set()
        await blocker
        return await asyncio.gather(*tasks)

    normalized, raw = asyncio.run(run())
    engine.stop()
    assert backend.passes[1:] == [[4, 7, 11] * 2]  # one pass served both
    assert np.allclose(np.linalg.norm(normalized.vectors, axis=1), 1) and np.linalg.norm(raw.vectors, axis=1).min() > 2
    assert np.allclose(raw.vectors / np.linalg.norm(raw.vectors, axis=1, keepdims=True), normalized.vectors)


def test_token_batches_slice_take_concat_and_pad_as_their_rows_do():
    from service.engine.backends.base import pad_batch
    from service.ipc.messages import TokenBatch

    rng = np.random.default_rng(3)
    rows = [rng.integers(1, 999, int(n)).tolist() for n in rng.integers(1, 12, 9)]
    types = [[k % 2] * len(r) for k, r in enumerate(rows)]
    batch = TokenBatch.from_rows(rows, types)

    def as_rows(b):
        return [(b.row(i).tolist(), b.type_row(i).tolist()) for i in range(len(b))]

    expected = list(zip(rows, types))
    order = np.array([4, 0, 8, 2, 2])
    assert as_rows(batch.take(order)) == [expected[i] for i in order]
    assert as_rows(batch.slice(3, 7)) == expected[3:7]
    assert as_rows(TokenBatch.concat([batch.slice(5, 9), batch.take(np.array([1]))])) == expected[5:9] + [expected[1]]
    # token ids a client sent carry no type ids; beside texts that do, theirs are zeros
    mixed = TokenBatch.concat([batch.slice(0, 2), TokenBatch.from_rows(rows[:1])])
    assert as_rows(mixed) == expected[:2] + [(rows[0], [0] * len(rows[0]))]
    feeds = pad_batch(batch.slice(2, 6), 12, pad_id=0, rows=6)
    for i, (ids, kinds) in enumerate(expected[2:6]):
        n = len(ids)
        assert feeds["input_ids"][i].tolist() == ids + [0] * (12 - n)
        assert feeds["attention_mask"][i].tolist() == [1] * n + [0] * (12 - n)
        assert feeds["token_type_ids"][i].tolist() == kinds + [0] * (12 - n)
    assert not feeds["attention_mask"][4:].any() and not feeds["input_ids"][4:].any()  # bucket rows: all padding


def test_the_queue_keeps_the_count_of_tokens_ahead_that_admission_bounds_a_wait_with():
    from service.engine.queue import BatchQueue, Job
    from service.ipc.messages import TokenBatch

    queue = BatchQueue(max_batch_tokens=64, max_batch_requests=4, pad_to_multiple_of=8, max_seq_length=32)
    jobs = [Job(TokenBatch.from_rows([[7] * n for n in sizes]), 8, float("inf"), lambda job: None)
            for sizes in ((5, 9, 6), (3,), (12, 4, 4, 4, 4))]
    for job in jobs:
        queue.put(job)
    assert queue.queued_tokens == sum(queue.remaining_tokens()) == 20 + 3 + 28
    while queue.queued_tokens:
        before = queue.queued_tokens
        batch = queue.next_batch()
        assert before - queue.queued_tokens == sum(job.tokens(start, n) for job, start, n in batch.parts)
        assert queue.queued_tokens == sum(queue.remaining_tokens())
    assert not queue.remaining_tokens()
    late = Job(TokenBatch.from_rows([[7] * 6]), 8, float("inf"), lambda job: None)
    queue.put(late)
    late.cancelled = True  # counted until the next pass drops it
    assert queue.queued_tokens == 6
    queue.close()
    assert queue.next_batch() is None and queue.queued_tokens == 0


def test_a_longer_text_among_a_steady_flow_of_short_ones_leads_a_pass_after_two_without_it():
    from service.engine.queue import MAX_PASSED_OVER, BatchQueue, Job
    from service.ipc.messages import TokenBatch

    def single(n: int) -> Job:
        return Job(TokenBatch.from_rows([[7] * n]), 8, float("inf"), lambda job: None)

    queue = BatchQueue(max_batch_tokens=4096, max_batch_requests=64, pad_to_multiple_of=1, max_seq_length=64)
    long = single(30)
    queue.put(long)
    passes = []
    for _ in range(6):  # short texts keep arriving: some before every pass
        for _ in range(5):
            queue.put(single(8))
        passes.append([job for job, _, _ in queue.next_batch().parts])
    # shorter texts are first in line, and 30 tokens is over twice their 8: left out until it has waited enough
    assert [long in p for p in passes[:MAX_PASSED_OVER]] == [False] * MAX_PASSED_OVER
    assert passes[MAX_PASSED_OVER][0] is long and passes[MAX_PASSED_OVER] == [long]  # the short ones: next pass
    assert all(long not in p and len(p) >= 5 for p in passes[MAX_PASSED_OVER + 1:])
