"""What every long-running process of the service does to itself once it is loaded."""

from __future__ import annotations

import gc


def settle_gc() -> None:
    """Leave what is loaded out of the cyclic collector's scans, and collect the young generation rarely.

    Everything imported and built at start lives as long as the process (gc.freeze), so no full
    collection scans it again. Under load the young generation holds mostly the in-flight requests'
    objects, which every young collection at the default threshold (700 allocations) would scan again
    while they are still in flight. Cycles are rare on the request path; the few there wait longer.
    """
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
