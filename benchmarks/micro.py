"""The small costs behind the service's hot-path choices, each timed alone (RESULTS.md cites what this printed).

- base64 of a 256 × 384 float32 answer: the standard library against pybase64 (the OpenAI route's);
- the same answer as JSON, orjson writing the floats (TEI's /embed);
- one short text through the API process's tokeniser (service.tokenization.Tokenizer, the export's);
- pyzmq: one round trip over inproc, per frame, for 4 and 64 frames (why a token batch is one buffer);
- a bundle of 16 single-text answers (header + one 384-float vector each), framed as the engine's socket carries
  it and taken apart: the buffers joined in one frame (`service.ipc.messages.bundle_replies`) against a frame each;
- a task per request waiting on an ASGI receive(), created and cancelled (what the disconnect hook replaced);
- glibc malloc: minor page faults and time per request of allocating, filling and freeing a 256-text request's
  two vector arrays, with the C library's defaults and with `service.process.keep_freed_memory` (a fresh
  interpreter each: the setting is process-wide).
- one request through a real engine process (null backend) and the API process's SocketEngineClient, one at a
  time: what the process split adds to a sequential request's latency when the engine is idle, beside this
  machine's floors for a wake-up (a thread round trip through two Events, a process round trip over a pipe);
- a small message's round trip to another process over ZeroMQ ipc and over a plain Unix socket, idle between:
  what ZeroMQ's own I/O threads add to each of those requests.

    python -m benchmarks.micro [--model-dir models/all-MiniLM-L6-v2] [--repeat 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path

import numpy as np

from benchmarks import machine

#: run in a fresh interpreter: prints minor faults and µs per request, defaults first, then kept
MALLOC = """
import resource, sys, time
import numpy as np
from service.process import keep_freed_memory

def cycle():
    normalized, raw = np.empty((256, 384), np.float32), np.empty((256, 384), np.float32)
    normalized[:] = raw[:] = 1.0

def measure(n=500):
    faults, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    for _ in range(n):
        cycle()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / n, (time.perf_counter() - start) / n * 1e6

if sys.argv[1] == "kept":
    keep_freed_memory()
measure(20)
print(*measure())
"""


def per_call_us(fn, repeat: int) -> float:
    return min(timeit.repeat(fn, number=repeat, repeat=3)) / repeat * 1e6


@contextlib.contextmanager
def inproc_pair():
    """Two connected ZeroMQ PAIR sockets over inproc, closed after."""
    import zmq

    context = zmq.Context()
    a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    a.bind("inproc://micro")
    b.connect("inproc://micro")
    try:
        yield a, b
    finally:
        a.close()
        b.close()
        context.term()


def zmq_round_trip_us(frames: int, repeat: int) -> float:
    message = [b"h" * 20] + [np.arange(14, dtype=np.int32).tobytes()] * (frames - 1)
    with inproc_pair() as (a, b):

        def round_trip():
            a.send_multipart(message)
            b.recv_multipart()

        return per_call_us(round_trip, repeat)


def bundle_round_trip_us(repeat: int, answers: int = 16) -> tuple[float, float]:
    """µs to bundle `answers` single-text answers, frame them for the engine's socket, take them out of the byte
    stream and decode them (the socket itself left out): (joined, a frame each)."""
    from service.ipc import messages
    from service.ipc.stream import Reader, encode

    vector = np.ones(384, dtype="<f4").data
    outgoing: list[tuple[messages.Reply, messages.Frames]] = [
        (messages.Vectors(i, (1, 384), 12, 0.001, 0.002), [vector]) for i in range(answers)]
    reader = Reader()

    def round_trip():
        for frames in reader.feed(b"".join(encode(messages.bundle_replies(outgoing)))):
            messages.decode_replies(frames)

    joined = per_call_us(round_trip, repeat)
    threshold, messages.JOIN_BELOW = messages.JOIN_BELOW, 0  # every buffer its own frame
    try:
        separate = per_call_us(round_trip, repeat)
    finally:
        messages.JOIN_BELOW = threshold
    return joined, separate


def watcher_us(repeat: int) -> tuple[float, float]:
    """µs a loop turn of a request costs with and without a task waiting on receive(), cancelled at its end, on
    the event loop uvicorn runs the service on (uvloop where installed)."""
    from uvicorn.config import Config

    async def measure() -> tuple[float, float]:
        never = asyncio.Event()

        async def receive():
            await never.wait()

        async def with_watcher():
            for _ in range(repeat):
                watcher = asyncio.ensure_future(receive())
                watcher.add_done_callback(lambda w: None)
                await asyncio.sleep(0)
                watcher.cancel()

        async def without():
            for _ in range(repeat):
                await asyncio.sleep(0)

        times = []
        for run in (with_watcher, without):
            start = asyncio.get_running_loop().time()
            await run()
            times.append((asyncio.get_running_loop().time() - start) / repeat * 1e6)
        return times[0], times[1]

    with asyncio.Runner(loop_factory=Config(app=None, loop="auto").get_loop_factory()) as runner:
        return runner.run(measure())


def wake_up_floors_us(repeat: int) -> tuple[float, float]:
    """Median µs of a round trip between two threads (Events) and between two processes (pipes, blocking reads):
    the two kinds of wake-up a request crosses in the service."""
    ping, pong = threading.Event(), threading.Event()

    def echo():
        for _ in range(repeat):
            ping.wait()
            ping.clear()
            pong.set()

    thread = threading.Thread(target=echo)
    thread.start()
    threads = []
    for _ in range(repeat):
        start = time.perf_counter()
        ping.set()
        pong.wait()
        pong.clear()
        threads.append(time.perf_counter() - start)
    thread.join()
    from_parent, to_child = os.pipe()
    from_child, to_parent = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", "import os, sys\nr, w = map(int, sys.argv[1:])\n"
                              "while os.read(r, 1): os.write(w, b'x')", str(from_parent), str(to_parent)],
                             pass_fds=(from_parent, to_parent))
    processes = []
    for _ in range(repeat):
        start = time.perf_counter()
        os.write(to_child, b"x")
        os.read(from_child, 1)
        processes.append(time.perf_counter() - start)
    os.close(to_child)
    child.wait()
    for fd in (from_parent, to_parent, from_child):
        os.close(fd)
    return statistics.median(threads) * 1e6, statistics.median(processes) * 1e6


#: the echo ends of `transport_round_trips_us`, each in a fresh interpreter: argv[1] is the address
_ZMQ_ECHO = """import sys, zmq
socket = zmq.Context().socket(zmq.ROUTER)
socket.bind(sys.argv[1])
while (message := socket.recv_multipart())[1] != b"q":
    socket.send_multipart(message)
"""
_UNIX_ECHO = """import socket, sys
server = socket.socket(socket.AF_UNIX)
server.bind(sys.argv[1])
server.listen(1)
connection, _ = server.accept()
while (data := connection.recv(65536)) not in (b"", b"q"):
    connection.sendall(data)
"""


def transport_round_trips_us(repeat: int, idle_s: float = 0.002) -> tuple[float, float]:
    """Median µs of a 100-byte message's round trip to an echo process, blocking on both sides, `idle_s`
    between messages (as a client waits between requests): over ZeroMQ ipc (DEALER → ROUTER, what the API
    processes and the engine use) and over a plain Unix stream socket. The difference is ZeroMQ's own I/O
    threads, which each message crosses on both sides: four thread wake-ups more a round trip."""
    import socket

    import zmq

    out = []
    with tempfile.TemporaryDirectory(prefix="sembed-micro-") as tmp:
        for script, address in ((_ZMQ_ECHO, f"ipc://{tmp}/zmq"), (_UNIX_ECHO, f"{tmp}/unix")):
            echo = subprocess.Popen([sys.executable, "-c", script, address])
            if script is _ZMQ_ECHO:
                dealer = zmq.Context.instance().socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.connect(address)
                send, receive = dealer.send, dealer.recv
            else:
                client = socket.socket(socket.AF_UNIX)
                for _ in range(500):  # until the echo process listens
                    try:
                        client.connect(address)
                        break
                    except (FileNotFoundError, ConnectionRefusedError):
                        time.sleep(0.01)
                send, receive = client.sendall, functools.partial(client.recv, 65536)
            times = []
            for i in range(repeat + 20):  # the first 20: connecting, warming up
                start = time.perf_counter()
                send(b"x" * 100)
                receive()
                if i >= 20:
                    times.append(time.perf_counter() - start)
                time.sleep(idle_s)
            send(b"q")
            echo.wait(timeout=30)
            (dealer if script is _ZMQ_ECHO else client).close()
            out.append(statistics.median(times) * 1e6)
    return out[0], out[1]


def engine_round_trip_us(model_dir: Path, rows: tuple[int, ...], repeat: int) -> dict[int, float]:
    """Median µs of one embed of `rows` 14-token rows through a real engine process (the null backend, as
    the supervisor starts it) and SocketEngineClient, one request at a time, a pause between them (idle)."""
    from service.api.client import SocketEngineClient
    from service.engine.socket_server import run
    from service.ipc.messages import TokenBatch
    from service.settings import Settings

    async def measure(endpoint: str) -> dict[int, float]:
        client = await SocketEngineClient(endpoint).connect(timeout_s=120)
        try:
            out = {}
            for n in rows:
                batch = TokenBatch(np.full(14 * n, 1000, np.int32), np.arange(0, 14 * n + 1, 14, dtype=np.int64))
                times = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    await client.embed(batch)
                    times.append(time.perf_counter() - start)
                    await asyncio.sleep(0.002)
                out[n] = statistics.median(times) * 1e6
            return out
        finally:
            await client.close()

    with tempfile.TemporaryDirectory(prefix="sembed-micro-") as tmp:
        endpoint = f"ipc://{tmp}/engine"
        engine = multiprocessing.get_context("spawn").Process(
            target=run, args=(Settings(backend="null"), str(model_dir), endpoint), daemon=True)
        engine.start()
        try:
            return asyncio.run(measure(endpoint))
        finally:
            engine.terminate()
            engine.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path("models/all-MiniLM-L6-v2"))
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args(argv)
    import pybase64

    from service.tokenization import Tokenizer

    print(machine.cpu_line())
    answer = np.random.default_rng(0).standard_normal((256, 384)).astype("<f4").tobytes()
    stdlib, simd = (per_call_us(lambda f=f: f(answer), max(1, args.repeat // 10))
                    for f in (base64.b64encode, pybase64.b64encode))
    print(f"base64 of 256 x 384 float32: standard library {stdlib:.0f} µs, pybase64 {simd:.0f} µs")
    import orjson

    unit = np.random.default_rng(1).standard_normal((256, 384)).astype(np.float32)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    json_us = per_call_us(lambda: orjson.dumps(unit, option=orjson.OPT_SERIALIZE_NUMPY), max(1, args.repeat // 100))
    print(f"orjson of 256 x 384 unit vectors (TEI's /embed answer): {json_us / 1000:.2f} ms, "
          f"{json_us * 1000 / unit.size:.0f} ns a number")
    tokenizer = Tokenizer(args.model_dir)
    text = ["A man is playing a large guitar on the stage tonight."]
    tokenise_us = per_call_us(lambda: tokenizer.encode(text), args.repeat)
    print(f"one short text through the API process's tokeniser: {tokenise_us:.1f} µs")
    for frames in (4, 64):
        us = zmq_round_trip_us(frames, max(1, args.repeat // frames))
        print(f"pyzmq inproc round trip of {frames} frames: {us:.1f} µs, {us / frames:.2f} µs a frame")
    joined, separate = bundle_round_trip_us(max(1, args.repeat // 16))
    print(f"a bundle of 16 single-text answers, framed and taken apart, buffers joined in one frame: {joined:.0f} µs, "
          f"a frame each: {separate:.0f} µs")
    with_task, without = watcher_us(args.repeat)
    print(f"a request's loop turn with a task waiting on receive(): {with_task:.1f} µs, without: {without:.1f} µs "
          f"({with_task - without:.1f} µs a request)")
    for mode in ("defaults", "kept"):
        out = subprocess.run([sys.executable, "-c", MALLOC, mode], capture_output=True, text=True, check=True)
        faults, us = map(float, out.stdout.split())
        print(f"two 393 KB vector arrays allocated, filled and freed, malloc {mode}: {faults:.1f} minor faults, "
              f"{us:.0f} µs")
    rtt = engine_round_trip_us(args.model_dir, (1, 32), max(20, args.repeat // 10))
    thread_us, process_us = wake_up_floors_us(max(20, args.repeat // 4))
    print("one request through an idle engine process (null backend) and SocketEngineClient: "
          + ", ".join(f"{n} row{'s' if n > 1 else ''} {us:.0f} µs" for n, us in rtt.items())
          + f"; this machine's wake-ups: thread round trip {thread_us:.0f} µs, process round trip {process_us:.0f} µs")
    over_zmq, over_unix = transport_round_trips_us(max(20, args.repeat // 10))
    print(f"a 100-byte round trip to another process, 2 ms idle between: ZeroMQ ipc {over_zmq:.0f} µs, "
          f"a Unix socket {over_unix:.0f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
