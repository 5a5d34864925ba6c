"""An upload token bucket shared by every upload of a process."""

from __future__ import annotations

import trio


class TokenBucket:
    """``take(n)`` returns once ``n`` bytes may be sent at ``rate`` bytes/s.

    ``rate`` 0 means uncapped. Callers are served in arrival order (trio's
    lock is fair), so concurrent uploads share the rate evenly. A burst of at
    most ``burst`` bytes may go out at once after an idle spell.
    """

    def __init__(self, rate_bytes_s: float, burst: int = 64 * 1024):
        self.rate = rate_bytes_s
        self.burst = burst
        self._tokens = float(burst)
        self._stamp = 0.0
        self._lock = trio.Lock()

    @classmethod
    def from_mbit(cls, mbit: float) -> TokenBucket:
        return cls(mbit * 1e6 / 8)

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        async with self._lock:
            now = trio.current_time()
            if self._stamp == 0.0:
                self._stamp = now
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= n
            if self._tokens < 0:
                # Sleep off the debt while holding the lock: later callers queue.
                await trio.sleep(-self._tokens / self.rate)
                self._stamp = trio.current_time()
                self._tokens = 0.0
