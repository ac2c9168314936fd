"""Streams: on a CPU the engine runs passes on several streams at once, a lone pass wide (queue.py, "Streams")."""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest

from service.api.registry import ModelRegistry
from service.engine.backends import padded_length
from service.engine.backends.fake import FakeBackend
from service.engine.backends.onnx import OnnxBackend
from service.engine.core import Engine, EngineConfig
from service.engine.queue import Job
from service.ipc.messages import TokenBatch
from tests.conftest import until


def make_engine(streams: int = 2, seconds_per_token: float = 0.0, **config):
    backend = FakeBackend(max_seq_length=64, pad_to_multiple_of=8, streams=streams,
                          seconds_per_token=seconds_per_token)
    engine = Engine(backend, EngineConfig.from_settings(**config))
    return engine, ModelRegistry().add_in_process("m", engine), backend


def alone(backend: FakeBackend, text: str) -> np.ndarray:
    batch = backend.tokenize([text])
    return backend.run(batch, padded_length(batch.tokens, backend.pad_to_multiple_of))[0][0]


def texts(n: int, tag: str, words: int = 20) -> list[str]:
    return [" ".join(f"{tag}{i}w{k}" for k in range(words)) for i in range(n)]


def test_under_load_every_stream_runs_a_pass_at_once_each_within_its_share_of_the_budget():
    engine, served, backend = make_engine(seconds_per_token=2e-5, max_batch_tokens=512, max_batch_requests=16)
    requests = [texts(12, f"r{r}") for r in range(6)]  # 22 tokens each, padded to 24

    async def run():
        return await asyncio.gather(*(served.embed(r) for r in requests))

    results = asyncio.run(run())
    engine.stop()
    assert backend.most_running == 2  # two passes at once
    assert max(backend.padded_tokens) <= 256 and max(map(len, backend.passes)) <= 8  # half the budget, half the rows
    assert not all(backend.wide)  # passes beside others run on their stream's share
    for request, result in zip(requests, results):
        for text, vector in zip(request, result.vectors):
            assert np.array_equal(vector, alone(backend, text))


def test_a_pass_alone_runs_wide_and_no_other_starts_until_it_ends():
    engine, served, backend = make_engine(max_batch_tokens=512)

    async def run():
        backend.gate.clear()
        first = asyncio.ensure_future(served.embed(["only this one"]))
        await until(backend.at_gate.is_set)  # taken alone: wide
        second = asyncio.ensure_future(served.embed(["and then this"]))
        await until(lambda: engine.queue.queued_rows() == 1)
        await asyncio.sleep(0.1)  # the other stream is free, yet must not start beside a wide pass
        assert backend.running == 1
        backend.gate.set()
        return await first, await second

    first, second = asyncio.run(run())
    engine.stop()
    assert backend.wide == [True, True] and backend.most_running == 1
    assert np.array_equal(first.vectors[0], alone(backend, "only this one"))
    assert np.array_equal(second.vectors[0], alone(backend, "and then this"))


def test_a_request_split_over_two_streams_is_answered_once_with_every_row():
    engine, served, backend = make_engine(seconds_per_token=1e-5, max_batch_tokens=256, max_batch_requests=64)
    request = texts(40, "s")  # 40 x 24 tokens: five passes of 128 tokens, on both streams

    result = asyncio.run(served.embed(request))
    engine.stop()
    assert backend.most_running == 2 and len(backend.passes) == 8
    for text, vector in zip(request, result.vectors):
        assert np.array_equal(vector, alone(backend, text))


def test_rows_arriving_at_idle_streams_are_shared_among_them():
    engine, served, backend = make_engine(seconds_per_token=1e-4, max_batch_tokens=4096, max_batch_requests=64)
    request = texts(9, "h")  # one pass's worth: yet two passes at once, of 5 and 4 rows, each on one stream

    result = asyncio.run(served.embed(request))
    engine.stop()
    assert sorted(map(len, backend.passes)) == [4, 5] and backend.wide == [False, False]
    assert backend.most_running == 2
    for text, vector in zip(request, result.vectors):
        assert np.array_equal(vector, alone(backend, text))


def test_a_job_filled_from_two_threads_at_once_finishes_once():
    batch = TokenBatch(np.arange(1, 201, dtype=np.int32), np.arange(0, 201, 2, dtype=np.int64))  # 100 rows
    for _ in range(50):
        done = []
        job = Job(batch, 4, float("inf"), done.append)
        job.schedule(100, 0.0)
        start = threading.Barrier(2)

        def fill(job: Job, start: threading.Barrier, rows: range) -> None:
            start.wait()
            for row in rows:
                job.fill(row, np.full((1, 4), row, np.float32), np.zeros((1, 4), np.float32), seconds=0.001)

        threads = [threading.Thread(target=fill, args=(job, start, range(k, 100, 2))) for k in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert done == [job] and np.array_equal(job.vectors[:, 0], np.arange(100))
        assert job.inference_s == pytest.approx(0.1)


def test_one_stream_is_the_old_engine_one_pass_at_a_time():
    engine, served, backend = make_engine(streams=1, seconds_per_token=1e-5, max_batch_tokens=256)
    asyncio.run(served.embed(texts(40, "o")))
    engine.stop()
    assert backend.most_running == 1 and not any(backend.wide)  # one session: nothing to widen to
    assert max(backend.padded_tokens) > 128  # the whole budget is the one stream's


# --- onnxruntime ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def streamed(default_export):
    return OnnxBackend(default_export, intra_op_threads=2, streams=0)  # 0: the default, two streams on two threads


def test_the_stream_session_runs_on_a_share_of_the_threads_and_gives_the_wide_bits(streamed):
    assert streamed.streams == 2
    assert streamed.session.get_session_options().intra_op_num_threads == 2
    assert streamed._narrow.get_session_options().intra_op_num_threads == 1
    rng = np.random.default_rng(3)
    words = "the cat sat on a mat while dogs bark loudly at night near old houses in quiet towns".split()
    items = streamed._tokenize([" ".join(rng.choice(words, int(n))) for n in rng.integers(1, 120, 24)])
    seq_len = padded_length(int(items.lengths.max()), streamed.pad_to_multiple_of)
    for wide, narrow in zip(streamed.run(items, seq_len), streamed.run(items, seq_len, wide=False)):
        assert np.array_equal(wide, narrow)


def test_two_passes_on_the_stream_session_at_once_give_each_its_own_bits(streamed):
    items = streamed._tokenize([f"text number {i} about rivers and hills" * (1 + i % 4) for i in range(16)])
    halves = [items.slice(0, 8), items.slice(8, 16)]
    expected = [streamed.run(h, streamed._seq_len(h))[0] for h in halves]
    got: list = [None, None]

    def run(k: int) -> None:
        for _ in range(5):
            out = streamed.run(halves[k], streamed._seq_len(halves[k]), wide=False)[0]
            assert got[k] is None or np.array_equal(out, got[k])
            got[k] = out

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(np.array_equal(g, e) for g, e in zip(got, expected))


def test_streams_default_to_two_where_there_are_threads_for_them(default_export, streamed):
    one = OnnxBackend(default_export, intra_op_threads=1, streams=0, pad_to_multiple_of=streamed.pad_to_multiple_of)
    assert one.streams == 1 and one._narrow is None and streamed.streams == 2


def test_more_streams_than_threads_or_streams_on_a_gpu_are_refused_by_name(default_export):
    with pytest.raises(ValueError, match="SEMBED_STREAMS=3 needs"):
        OnnxBackend(default_export, intra_op_threads=2, streams=3)
    with pytest.raises(ValueError, match="SEMBED_STREAMS=2 on cuda"):
        OnnxBackend(default_export, device="cuda", intra_op_threads=2, streams=2)


def test_the_streams_bench_measures_both_ways_of_spending_the_threads(default_export, tmp_path, capsys):
    from benchmarks import streams as bench

    out = tmp_path / "streams.json"
    assert bench.main(["--model-dir", str(default_export), "--threads", "2", "--lengths", "8,24", "--tokens", "48",
                       "--seconds", "0.05", "--rounds", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["length"], r["rows"]) for r in rows] == [(8, 6), (24, 2)]
    assert all(r["one_pass"] > 0 and r["streams"] > 0 and len(r["rounds"]["2"]) == 2 for r in rows)
    assert "one pass at a time on all of them, against 2 passes at once on 1 each" in capsys.readouterr().out


def test_where_the_sessions_disagree_on_bits_the_engine_runs_one_pass_at_a_time(default_export, monkeypatch, caplog,
                                                                                  streamed):
    monkeypatch.setattr(OnnxBackend, "_streams_agree", lambda self: False)
    backend = OnnxBackend(default_export, intra_op_threads=2, streams=2, pad_to_multiple_of=streamed.pad_to_multiple_of)
    assert backend.streams == 1 and backend._narrow is None
    assert "other bits on 1 threads than on 2" in caplog.text
