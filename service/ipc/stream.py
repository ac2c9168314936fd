"""Messages of several frames over a Unix stream socket: the API processes' connection to an engine.

ZeroMQ's ipc transport carried this path until its own I/O threads showed up in every request's latency: a
message crosses one on each side, two more thread wake-ups each way, and on the 2-core VM an idle round trip to
another process took 656 µs over ZeroMQ ipc against 70 µs over a plain Unix socket (`python -m benchmarks.micro`;
RESULTS.md). So the engine and its clients write to the socket themselves, framed as

    [u32 frame count n][u32 length] × n, then the n frames' bytes, end to end

(little-endian), and a reader takes whole messages out of whatever pieces the stream delivers. The supervisor's
control sockets and the index process keep ZeroMQ: nothing there is on a request's path.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence

_U32 = struct.Struct("<I")
#: a message with more frames, or more bytes, than this is refused as corrupt, not buffered
MAX_FRAMES = 1 << 16
MAX_MESSAGE_BYTES = 1 << 31
#: the most buffers one sendmsg takes (Linux's IOV_MAX is 1024)
MAX_BUFFERS_PER_SEND = 512
ENDPOINT_SCHEME = "ipc://"


def socket_path(endpoint: str) -> str:
    """The file path of an "ipc://<path>" endpoint."""
    if not endpoint.startswith(ENDPOINT_SCHEME) or len(endpoint) == len(ENDPOINT_SCHEME):
        raise ValueError(f"an engine endpoint is ipc://<path of a Unix socket>, not {endpoint!r}")
    return endpoint[len(ENDPOINT_SCHEME):]


def encode(frames: Sequence) -> list:
    """One message's buffers as they go on the wire: its count and lengths, then the frames themselves (uncopied)."""
    lengths = [memoryview(frame).nbytes for frame in frames]
    return [struct.pack(f"<{len(lengths) + 1}I", len(lengths), *lengths), *frames]


def sent(buffers: list, n: int) -> list:
    """What is left of `buffers` after a write took their first `n` bytes."""
    for i, buffer in enumerate(buffers):
        size = memoryview(buffer).nbytes
        if n < size:
            return [memoryview(buffer).cast("B")[n:], *buffers[i + 1:]]
        n -= size
    return []


class Reader:
    """Whole messages out of a byte stream that arrives in pieces of any size."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data) -> list[list[memoryview]]:
        """The messages `data` completed, each a list of frames (views of one bytes object per call)."""
        buffer = self._buffer
        buffer += data
        ends, at = [], 0
        while len(buffer) - at >= 4:
            (count,) = _U32.unpack_from(buffer, at)
            head = 4 + 4 * count
            if count > MAX_FRAMES:
                raise ValueError(f"a message of {count} frames: the stream is corrupt")
            if len(buffer) - at < head:
                break
            lengths = struct.unpack_from(f"<{count}I", buffer, at + 4)
            total = head + sum(lengths)
            if total > MAX_MESSAGE_BYTES:
                raise ValueError(f"a message of {total} bytes: the stream is corrupt")
            if len(buffer) - at < total:
                break
            ends.append((at + head, lengths))
            at += total
        if not at:
            return []
        with memoryview(buffer) as view:
            whole = memoryview(bytes(view[:at]))  # one copy: the buffer takes the next pieces
        del buffer[:at]
        messages = []
        for start, lengths in ends:
            frames = []
            for n in lengths:
                frames.append(whole[start:start + n])
                start += n
            messages.append(frames)
        return messages


def ask(endpoint: str, frames: Sequence, timeout_s: float) -> list[memoryview] | None:
    """One message to the socket at `endpoint` and the first message back, blocking (the supervisor's probe of
    an engine it started): None where nothing listens there yet or no answer came within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(socket_path(endpoint))
            sock.sendmsg(encode(frames))
            reader = Reader()
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                data = sock.recv(1 << 16)
                if not data:
                    return None
                if messages := reader.feed(data):
                    return messages[0]
        except OSError:  # no socket file yet, nobody listening, or the timeout
            return None
    return None
