"""What every long-running process of the service does to itself once it is loaded."""

from __future__ import annotations

import ctypes
import gc
import logging

log = logging.getLogger("sembed.process")

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def settle_memory() -> None:
    """The collector and the allocator set for serving: `settle_gc` and `keep_freed_memory`."""
    settle_gc()
    keep_freed_memory()


def settle_gc() -> None:
    """Leave what is loaded out of the cyclic collector's scans, and collect the young generation rarely.

    Everything imported and built at start lives as long as the process (gc.freeze), so no full
    collection scans it again. Under load the young generation holds mostly the in-flight requests'
    objects, which every young collection at the default threshold (700 allocations) would scan again
    while they are still in flight. Cycles are rare on the request path; the few there wait longer.
    """
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 64 << 20) -> bool:
    """Let glibc's malloc reuse a request's freed buffers instead of giving them back to the kernel.

    A batch's arrays are hundreds of KB (256 vectors of 384 float32: 393 KB). By default glibc serves
    such sizes from fresh mmaps, or trims them off the heap's top once freed, so the next request's
    buffers fault in from the kernel again, page by page, on every request (`python -m benchmarks.micro`
    measures both; RESULTS.md, "The server's own CPU"). Fixed thresholds keep blocks under 32 MB in the
    heap and keep up to 64 MB of freed heap top for reuse. False where the C library has no
    mallopt (not glibc): nothing changes there.
    """
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    done = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1 and mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1
    if not done:
        log.info("mallopt refused the thresholds: the C library keeps its own")
    return done
