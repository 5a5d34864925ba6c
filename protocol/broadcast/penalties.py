"""Peers that waste a downloader's time: stall counts and bans.

A peer that stalls a chunk request is struck; ``stalls_to_ban`` strikes
within ``ban_s``, a chunk that fails its hash, or a denied chunk the peer
announces, ban it from our downloads for ``ban_s``. A peer that never sent
us a good chunk gets no fewer strikes: banned at its first stall, an honest
node slow once in its first version was banned by the two others, which
then waited ``seed_retry_s`` at every version for the chunks the learner
had sent it (a sync baseline of bench/attacks.py at 0.70 of the others,
2026-11-29 17:31 UTC). A stranger's stall no longer holds a version (the
endgame copies its request to the seed, ``scheduler.Download``), and after
it the stranger is doubtful: asked last, and what only it announces is
asked of the seed at once. Both tables forget old entries as
they go, so a swarm of short-lived strangers cannot grow them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from protocol.broadcast.settings import BroadcastConfig, Stats
from protocol.process.logs import event

log = logging.getLogger(__name__)


class Penalties:
    def __init__(self, config: BroadcastConfig, stats: Stats, on_ban: Callable[[str], None]):
        self.config = config
        self.stats = stats
        self._on_ban = on_ban  # the engine drops the peer from its download
        self._stall_times: dict[str, list[float]] = {}  # recent stalls per peer
        self._banned_until: dict[str, float] = {}  # peers we ask for nothing (they stalled or lied)

    def banned(self, peer: str) -> bool:
        return self._banned_until.get(peer, 0.0) > trio.current_time()

    def strike(self, peer: str) -> None:
        """``peer`` stalled a request."""
        now = trio.current_time()
        for p in [p for p, times in self._stall_times.items() if times[-1] < now - self.config.ban_s]:
            del self._stall_times[p]
        recent = [t for t in self._stall_times.get(peer, []) if t > now - self.config.ban_s] + [now]
        self._stall_times[peer] = recent
        if len(recent) >= self.config.stalls_to_ban:
            self.ban(peer, f"stalled {len(recent)} times")

    def ban(self, peer: str, why: str, **fields: Any) -> None:
        now = trio.current_time()
        for p in [p for p, until in self._banned_until.items() if until < now]:
            del self._banned_until[p]
        self._banned_until[peer] = now + self.config.ban_s
        self._stall_times.pop(peer, None)
        self.stats.peer_bans[peer] += 1
        event(
            log,
            logging.WARNING,
            f"peer {why}; asking it for nothing for {self.config.ban_s:.0f} s",
            peer=peer,
            **fields,
        )
        self._on_ban(peer)
