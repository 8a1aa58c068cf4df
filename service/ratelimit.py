"""Per-key token buckets, and the per-key cap on open event streams. Renders are charged by
pixels (width x height x frames), so one 4-megapixel frame costs what 256 thumbnails do.

With REDIS_URL set the buckets and the stream slots live in Redis (one Lua script per charge, atomic), so N API
replicas together allow the configured rate, not N times it; without Redis (embedded mode,
one process) they are kept in memory.
"""

from __future__ import annotations

import math
import threading
import time
import uuid


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


class StreamSlots:
    """Open event streams per key (MAX_STREAMS_PER_KEY), in this process. A stream takes a slot
    (`acquire`, None when the key is at the cap), keeps it alive (`refresh`, every
    STREAM_LEASE_S / 3) and gives it back (`release`)."""

    def __init__(self, cap: int):
        self.cap = cap
        self._open: dict[str, set[str]] = {}

    async def acquire(self, kid: str) -> str | None:
        held = self._open.setdefault(kid, set())
        if len(held) >= self.cap:
            return None
        slot = uuid.uuid4().hex
        held.add(slot)
        return slot

    async def count(self, kid: str) -> int:
        return len(self._open.get(kid, ()))

    async def refresh(self, kid: str, slot: str) -> None:
        pass

    async def release(self, kid: str, slot: str) -> None:
        self._open.get(kid, set()).discard(slot)


# A slot not refreshed for this long is free again: an API replica that died holding streams
# does not keep its keys at the cap.
STREAM_LEASE_S = 60

# KEYS[1] the key's slots (sorted set: slot -> expiry); ARGV: cap, slot, lease s.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]) + 60)
return 1
"""
_REFRESH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]) + 60)
return 1
"""
_COUNT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
return redis.call('ZCOUNT', KEYS[1], now, '+inf')
"""


class RedisStreamSlots(StreamSlots):
    """The same slots in Redis, so N API replicas together hold MAX_STREAMS_PER_KEY per key."""

    def __init__(self, redis_url: str, cap: int, prefix: str = "nf:streams"):
        super().__init__(cap)
        import redis.asyncio

        self.redis = redis.asyncio.Redis.from_url(redis_url)
        self.prefix = prefix
        self._acquire = self.redis.register_script(_ACQUIRE)
        self._refresh = self.redis.register_script(_REFRESH)
        self._count = self.redis.register_script(_COUNT)

    async def acquire(self, kid: str) -> str | None:
        slot = uuid.uuid4().hex
        got = await self._acquire(
            keys=[f"{self.prefix}:{kid}"], args=[self.cap, slot, STREAM_LEASE_S]
        )
        return slot if int(got) else None

    async def count(self, kid: str) -> int:
        return int(await self._count(keys=[f"{self.prefix}:{kid}"]))

    async def refresh(self, kid: str, slot: str) -> None:
        await self._refresh(keys=[f"{self.prefix}:{kid}"], args=[slot, STREAM_LEASE_S])

    async def release(self, kid: str, slot: str) -> None:
        await self.redis.zrem(f"{self.prefix}:{kid}", slot)


def make_stream_slots(settings) -> StreamSlots:
    if settings.redis_url:
        return RedisStreamSlots(settings.redis_url, settings.max_streams_per_key)
    return StreamSlots(settings.max_streams_per_key)
