"""Messages of several frames over a Unix stream socket: the API processes' connection to an engine.

ZeroMQ's ipc transport carried this path until its own I/O threads showed up in every request's latency: a
message crosses one on each side, two more thread wake-ups each way, several times a plain Unix socket's round
trip (`python -m benchmarks.micro`; RESULTS.md, "The server's own CPU"). So the engine and its clients write to
the socket themselves, framed as

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

#: what a frame may be: bytes, or a view of an array or of what was received (no copy)
Buffer = bytes | bytearray | memoryview


def socket_path(endpoint: str) -> str:
    """The file path of an "ipc://<path>" endpoint."""
    if not endpoint.startswith(ENDPOINT_SCHEME) or len(endpoint) == len(ENDPOINT_SCHEME):
        raise ValueError(f"an engine endpoint is ipc://<path of a Unix socket>, not {endpoint!r}")
    return endpoint[len(ENDPOINT_SCHEME):]


def encode(frames: Sequence[Buffer]) -> list[Buffer]:
    """One message's buffers as they go on the wire: its count and lengths, then the frames themselves (uncopied)."""
    lengths = [memoryview(frame).nbytes for frame in frames]
    return [struct.pack(f"<{len(lengths) + 1}I", len(lengths), *lengths), *frames]


def unwritten(buffers: list[Buffer], n: int) -> list[Buffer]:
    """What is left of `buffers` after a write took their first `n` bytes."""
    for i, buffer in enumerate(buffers):
        size = memoryview(buffer).nbytes
        if n < size:
            return [memoryview(buffer).cast("B")[n:], *buffers[i + 1:]]
        n -= size
    return []


class Reader:
    """Whole messages out of a byte stream that arrives in pieces of any size, read straight into its buffer
    (`get_buffer`, then `buffer_updated`: asyncio's BufferedProtocol, or a socket's recv_into). A buffer that
    ends on a message's end is handed over whole, its frames views of it, and a new one takes the next reads, so
    a large answer is copied once, by the kernel."""

    def __init__(self, chunk: int = 1 << 16):
        self._chunk = chunk
        self._buffer = bytearray(chunk)
        self._filled = 0
        self._next_end = 0  # where the message being read ends, once its head is in (0: not yet)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next bytes go: room for the rest of the message being read, or for a chunk."""
        need = max(self._next_end - self._filled, self._chunk)
        if len(self._buffer) - self._filled < need:
            grown = bytearray(self._filled + need)
            grown[:self._filled] = memoryview(self._buffer)[:self._filled]
            self._buffer = grown
        return memoryview(self._buffer)[self._filled:]

    def buffer_updated(self, n: int) -> list[list[memoryview]]:
        """`n` bytes were written where `get_buffer` said: the messages they completed, each a list of frames."""
        self._filled += n
        buffer, filled = self._buffer, self._filled
        ends, at = [], 0
        self._next_end = 0
        while filled - at >= 4:
            (count,) = _U32.unpack_from(buffer, at)
            head = 4 + 4 * count
            if count > MAX_FRAMES:
                raise ValueError(f"a message of {count} frames: the stream is corrupt")
            if filled - at < head:
                break
            lengths = struct.unpack_from(f"<{count}I", buffer, at + 4)
            total = head + sum(lengths)
            if total > MAX_MESSAGE_BYTES:
                raise ValueError(f"a message of {total} bytes: the stream is corrupt")
            if filled - at < total:
                self._next_end = total  # counted from `at`, which becomes the new buffer's start
                break
            ends.append((at + head, lengths))
            at += total
        if not at:
            return []
        # the complete messages keep this buffer; what follows them (the start of the next) moves to a new one
        rest = filled - at
        self._buffer = bytearray(max(self._chunk, self._next_end))
        self._buffer[:rest] = memoryview(buffer)[at:filled]
        self._filled = rest
        whole = memoryview(buffer)
        messages = []
        for start, lengths in ends:
            frames = []
            for length in lengths:
                frames.append(whole[start:start + length])
                start += length
            messages.append(frames)
        return messages

    def feed(self, data: Buffer) -> list[list[memoryview]]:
        """The same for bytes already read (tests, the supervisor's probe)."""
        data = memoryview(data).cast("B")
        messages, at = [], 0
        while at < len(data):
            target = self.get_buffer()
            n = min(len(target), len(data) - at)
            target[:n] = data[at:at + n]
            at += n
            messages += self.buffer_updated(n)
        return messages


def ask(endpoint: str, frames: Sequence[Buffer], timeout_s: float) -> list[memoryview] | None:
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
