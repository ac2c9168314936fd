"""Admission by expected wait: a request is refused only when it would wait too long, not because
other requests hold a count of permits.

The queue fills each pass with the least-served requests first (then the smallest), so it behaves
like processor sharing at the grain of a pass (least attained service): a request of T tokens is held
up, beyond its own work, by the pass running now and, from each request ahead of it, at most about T
of theirs (a one-text request overtakes a 256-text one after one pass). Its expected queueing time is
therefore

    wait(T) = (sum_j min(remaining_j, T) + tokens of the pass running now) / rate

(its own T is not waiting: an idle engine admits a request however large, and serves it at once)

with `rate` the input tokens per second the backend has been measured to get through. Above
`max_wait_s` the request is refused (429) with Retry-After from that estimate: under overload
the requests shed are the ones that would wait longest, the large ones, while a small request
still gets into the next pass.
"""

from __future__ import annotations

import math
import threading

#: how fast the pass-rate estimate follows the measured passes
RATE_SMOOTHING = 0.2


class Admission:
    def __init__(self, max_wait_s: float):
        self.max_wait_s = max_wait_s
        self._rate: float | None = None  # none measured yet: nothing to estimate a wait from
        self._lock = threading.Lock()

    @property
    def rate(self) -> float | None:
        """Input tokens per second the backend gets through (its padding included in the time), as measured."""
        return self._rate

    def observe_pass(self, tokens: int, seconds: float) -> None:
        if seconds <= 0 or tokens <= 0:
            return
        with self._lock:
            measured = tokens / seconds
            self._rate = measured if self._rate is None else self._rate + RATE_SMOOTHING * (measured - self._rate)

    def expected_wait(self, tokens: int, queued: list[int], running: int = 0) -> float:
        """Seconds a request of `tokens` would wait for the other requests: `queued` ones' remaining tokens, as
        the fair queue takes turns with it, and the pass now running (0 before any pass was measured)."""
        return self.wait_for(sum(min(r, tokens) for r in queued) + running)

    def wait_for(self, tokens_ahead: int) -> float:
        """Seconds the backend takes to get through `tokens_ahead` at the measured rate (0 before any pass)."""
        return 0.0 if self._rate is None else tokens_ahead / self._rate

    def retry_after(self, wait_s: float) -> float:
        """When a refused request could expect to get in: once the excess over the bound has drained."""
        return max(1.0, math.ceil(wait_s - self.max_wait_s))
