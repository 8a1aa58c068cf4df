"""Per-key token buckets. Renders are charged by pixels (width x height x frames), so one
4-megapixel frame costs what 256 thumbnails do.

With REDIS_URL set the buckets live in Redis (one Lua script per charge, atomic), so N API
replicas together allow the configured rate, not N times it; without Redis (embedded mode,
one process) they are kept in memory.
"""

from __future__ import annotations

import math
import threading
import time


class TokenBucket:
    """`rate_per_min` tokens a minute, at most `burst` saved up; a request takes `cost` tokens."""

    def __init__(self, rate_per_min: float, burst: float, clock=time.monotonic):
        if rate_per_min <= 0 or burst < 1:
            raise ValueError("rate_per_min must be > 0 and burst >= 1")
        self.rate = rate_per_min / 60.0
        self.burst = float(burst)
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill)
        self._lock = threading.Lock()

    async def take(self, key: str, cost: float = 1.0) -> float:
        return self.take_now(key, cost)

    def take_now(self, key: str, cost: float = 1.0) -> float:
        """0.0 when allowed, else the seconds until `cost` tokens are free (for Retry-After)."""
        cost = min(float(cost), self.burst)
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= cost:
                self._buckets[key] = (tokens - cost, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (cost - tokens) / self.rate

    @staticmethod
    def retry_after(wait_s: float) -> str:
        return str(max(1, math.ceil(wait_s)))


# KEYS[1] bucket hash; ARGV: rate per s, burst, cost. Redis' own clock, so replicas agree.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(b[1]) or burst, tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local wait = 0
if tokens >= cost then tokens = tokens - cost else wait = (cost - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return tostring(wait)
"""


class RedisTokenBucket(TokenBucket):
    def __init__(self, redis_url: str, rate_per_min: float, burst: float, prefix: str):
        super().__init__(rate_per_min, burst)
        import redis.asyncio

        self.redis = redis.asyncio.Redis.from_url(redis_url)
        self.prefix = prefix
        self._script = self.redis.register_script(_TAKE)

    async def take(self, key: str, cost: float = 1.0) -> float:
        cost = min(float(cost), self.burst)
        wait = await self._script(keys=[f"{self.prefix}:{key}"], args=[self.rate, self.burst, cost])
        return float(wait)


def make_bucket(settings, rate_per_min: float, burst: float, name: str) -> TokenBucket:
    if settings.redis_url:
        return RedisTokenBucket(settings.redis_url, rate_per_min, burst, f"nf:bucket:{name}")
    return TokenBucket(rate_per_min, burst)
