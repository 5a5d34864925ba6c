"""The serving side's rate limits: the upload token bucket shared by every
upload of a process, and the pace of refusals to each peer."""

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


class RefusalPace:
    """How soon a peer's next request is read after we refused one.

    A refusal (``busy``, an unknown chunk or version) costs the requester one
    round trip and the server a read, a decode and a reply: two leechers
    looping requests on four streams each took the learner's event loop from
    14 % to 45 % busy in a sync swarm, and its steps fell to 0.65-0.7 of their
    rate (py-spy; bench/attacker.py empty_have_leech against one sync swarm,
    2026-12-01). So each
    refusal puts the peer's next request, on any of its streams, off by
    ``pause_s``, doubled for each further refusal in a row up to
    ``max_pause_s``; a peer that then waits ``max_pause_s`` longer than it
    had to starts again from ``pause_s``. (A chunk served in between does not
    reset it: a free rider is served now and then, and would get a burst of
    quick refusals after each.) An honest downloader rests a peer that
    answered ``busy`` at least this long before asking it again
    (``SchedulerConfig.busy_backoff_s``, doubled up to ``busy_backoff_max_s``),
    so it never waits for this. Peers remembered: at most ``max_peers``
    (then forgotten at once: what a forgotten peer regains is a few quick
    refusals).
    """

    def __init__(self, pause_s: float, max_pause_s: float, max_peers: int = 4096):
        self.pause_s = pause_s
        self.max_pause_s = max_pause_s
        self.max_peers = max_peers
        self._next: dict[str, tuple[float, int]] = {}  # peer -> (read its next request no sooner, refusals in a row)

    def refused(self, peer: str) -> None:
        now = trio.current_time()
        at, streak = self._next.get(peer, (now, 0))
        if now > at + self.max_pause_s:
            at, streak = now, 0  # it kept away on its own
        if peer not in self._next and len(self._next) >= self.max_peers:
            self._next.clear()
        pause = min(self.pause_s * 2 ** min(streak, 20), self.max_pause_s)
        self._next[peer] = (max(at, now) + pause, streak + 1)

    async def wait(self, peer: str) -> None:
        """Return once ``peer``'s next request may be read."""
        at, _ = self._next.get(peer, (0.0, 0))
        if at > trio.current_time():
            await trio.sleep_until(at)
