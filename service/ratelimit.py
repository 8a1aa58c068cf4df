"""Per-key token buckets for render and path requests, kept in the API process.

Each API process limits on its own (N replicas allow N times the rate); renders are the
expensive calls, and a shared limiter would need Redis round trips on every one.
"""

from __future__ import annotations

import math
import threading
import time


class TokenBucket:
    """`rate_per_min` tokens a minute, at most `burst` saved up; one request takes one token."""

    def __init__(self, rate_per_min: float, burst: int, clock=time.monotonic):
        if rate_per_min <= 0 or burst < 1:
            raise ValueError("rate_per_min must be > 0 and burst >= 1")
        self.rate = rate_per_min / 60.0
        self.burst = float(burst)
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill)
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """0.0 when allowed, else the seconds until a token is free (for Retry-After)."""
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate

    @staticmethod
    def retry_after(wait_s: float) -> str:
        return str(max(1, math.ceil(wait_s)))
