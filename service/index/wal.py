"""The write-ahead log: every write is a record here, fsynced before it is applied or acknowledged.

A record is a 20-byte header (magic, payload length, sequence number, CRC-32 of sequence and
payload) and its payload. A crash can leave the last record torn (cut short, or with garbage
after the last complete one); opening the log detects that by length and checksum and cuts it
off: such a record was never acknowledged, since acknowledgement follows the fsync that covers
it. A bad record anywhere but at the tail of the last segment is damage, not a crash, and opening
refuses rather than silently drop acknowledged writes.

The log is a folder of segments named by their first sequence number. A snapshot at sequence S
starts a new segment, and segments wholly at or below the oldest kept snapshot are deleted.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

from service.index.base import NotDurable

log = logging.getLogger("sembed.index")

MAGIC = 0x314C4157  # "WAL1"
HEADER = struct.Struct("<IIQI")
MAX_RECORD = 1 << 30
SUFFIX = ".wal"


class CorruptLog(Exception):
    pass


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _checksum(seq: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(struct.pack("<Q", seq)))


def encode(seq: int, payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, len(payload), seq, _checksum(seq, payload)) + payload


def _records(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(seq, end offset, payload) of each valid record, stopping at the first invalid byte."""
    pos = 0
    while pos + HEADER.size <= len(data):
        magic, length, seq, crc = HEADER.unpack_from(data, pos)
        end = pos + HEADER.size + length
        if magic != MAGIC or length > MAX_RECORD or end > len(data):
            return
        payload = data[pos + HEADER.size: end]
        if _checksum(seq, payload) != crc:
            return
        yield seq, end, payload
        pos = end


class WriteAheadLog:
    def __init__(self, folder: Path, fsync: bool = True):
        self.folder = Path(folder)
        self.fsync = fsync
        if not self.folder.is_dir():
            self.folder.mkdir(parents=True)
            if fsync:  # the folder's own entry must last, or a crash can lose the whole log
                fsync_dir(self.folder.parent)
        self.last_seq = 0  # the last sequence number written (durable once sync returns)
        self._fd: int | None = None
        self._path: Path | None = None  # the segment being written
        self._offset = 0  # bytes of the current segment that hold complete records
        self.broken: str | None = None  # why writes are refused, after a failed fsync

    def segments(self) -> list[Path]:
        return sorted(self.folder.glob(f"*{SUFFIX}"))

    def replay(self, after: int) -> Iterator[tuple[int, bytes]]:
        """Every record with a sequence number above `after`, in order; cuts a torn tail off.

        Each segment's name is its first record's sequence number, so a lost segment shows as a
        gap even when the segment after it is still empty."""
        segments = self.segments()
        if segments and _first_seq(segments[0]) > after + 1:
            raise CorruptLog(f"the log starts at sequence {_first_seq(segments[0])} but the snapshot ends at "
                             f"{after}: records are missing")
        expected = None  # the next record's sequence number
        for i, segment in enumerate(segments):
            first = _first_seq(segment)
            if expected is not None and first > expected:
                raise CorruptLog(f"{segment}: starts at sequence {first}, but the log before it ends at "
                                 f"{expected - 1}: records are missing")
            data = segment.read_bytes()
            end = 0
            for seq, record_end, payload in _records(data):
                want = expected if end else first
                if seq != want or (expected is not None and seq != expected):
                    raise CorruptLog(f"{segment}: sequence {seq} at offset {end}, where {want} was expected")
                end = record_end
                expected = seq + 1
                self.last_seq = seq
                if seq > after:
                    yield seq, payload
            if end < len(data):
                if i < len(segments) - 1:
                    raise CorruptLog(f"{segment}: {len(data) - end} bad bytes at offset {end}, before the last "
                                     f"segment: the log is damaged")
                log.warning("log %s: cut a torn tail of %d bytes at offset %d (a write not acknowledged)",
                            segment, len(data) - end, end)
                with open(segment, "r+b") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
        self.last_seq = max(self.last_seq, after)

    def open(self) -> None:
        """Append after the last record (call after replay)."""
        segments = self.segments()
        if segments and segments[-1].stat().st_size == 0 and _first_seq(segments[-1]) != self.last_seq + 1:
            # an empty segment from a rotation that was undone (its folder sync failed) and came
            # back after a crash: records must not go into a segment named for another sequence
            segments.pop().unlink()
        if not segments:
            self.rotate()
            return
        self._open(segments[-1])

    def rotate(self) -> None:
        """Start a new segment; the next record's sequence number names it. Durable (the folder is
        synced) before any record goes in; on failure the current segment stays in use."""
        if self.broken:
            raise NotDurable(f"the index log is unavailable ({self.broken}); restart the service", 503)
        path = self.folder / f"{self.last_seq + 1:020d}{SUFFIX}"
        if path == self._path:
            return  # the current segment holds no record yet
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise _not_durable(e) from e
        if self.fsync:
            try:
                fsync_dir(self.folder)
            except OSError as e:  # its entry may not last: write on in the current segment
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise _not_durable(e) from e
        self.close()
        self._fd, self._path = fd, path
        self._offset = os.lseek(fd, 0, os.SEEK_END)

    def append(self, payload: bytes) -> int:
        """Write one record (not yet durable); on failure nothing of it stays in the file."""
        if self.broken:
            raise NotDurable(f"the index log is unavailable ({self.broken}); restart the service", 503)
        seq = self.last_seq + 1
        record = encode(seq, payload)
        try:
            view = memoryview(record)
            while view:  # os.write may write part of it
                view = view[os.write(self._open_fd(), view):]
        except OSError as e:
            self._cut_back()
            raise _not_durable(e) from e
        self._offset += len(record)
        self.last_seq = seq
        return seq

    def sync(self) -> None:
        """Make every appended record durable. A failed fsync leaves the page cache's state unknown
        (Linux may drop the dirty pages), so the log refuses writes from then on, as PostgreSQL does."""
        if not self.fsync:
            return
        try:
            os.fsync(self._open_fd())
        except OSError as e:
            self.broken = f"fsync failed: {e.strerror or e}"
            raise _not_durable(e) from e

    def undo_unsynced(self, offset: int, seq: int) -> None:
        """Drop records written after `offset` (their group's fsync failed)."""
        self._offset, self.last_seq = offset, seq
        self._cut_back()

    def _open_fd(self) -> int:
        if self._fd is None:
            raise RuntimeError("the index log is closed")
        return self._fd

    @property
    def position(self) -> tuple[int, int]:
        return self._offset, self.last_seq

    def _cut_back(self) -> None:
        try:
            os.ftruncate(self._open_fd(), self._offset)  # O_APPEND: the next write lands at the new end
        except OSError as e:
            self.broken = f"could not cut a failed write back: {e}"

    def drop_before(self, seq: int) -> None:
        """Delete segments whose records all have sequence numbers <= seq."""
        segments = self.segments()
        for segment, following in zip(segments, segments[1:]):
            if _first_seq(following) <= seq + 1:
                segment.unlink()

    def _open(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._path = path
        self._offset = os.lseek(self._fd, 0, os.SEEK_END)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = self._path = None


def _first_seq(segment: Path) -> int:
    try:
        return int(segment.name[: -len(SUFFIX)])
    except ValueError:
        raise CorruptLog(f"{segment}: not a log segment (its name is not a sequence number)") from None


def _not_durable(e: OSError) -> NotDurable:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return NotDurable(f"the index volume is full ({e.strerror}); the write was not applied", 507)
    return NotDurable(f"the index volume refused the write ({e.strerror or e}); the write was not applied", 503)
