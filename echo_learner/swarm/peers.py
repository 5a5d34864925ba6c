"""What the learner knows about each node: what it runs, what it did, whether it is banned.

Fed by the work and rollout handlers; read by the capacity model, the HTTP
API and the ban check. Bounded: the least recently seen peers are forgotten
beyond ``max_peers`` (a forgotten peer's ledger rows remain).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from echo_learner.swarm.capacity import running_mean
from echo_learner.swarm.changes import Changes
from echo_learner.verify.verifier import ACCEPTED, STRIKES
from protocol.process.logs import event
from protocol.wire.work import WorkRequest

log = logging.getLogger(__name__)

# Weight of the newest sample in a node's throughput average.
EWMA = 0.3
# Requests refused for going over a rate (work requests waiting, receipt
# pages): an honest node may hit a limit now and then, one that keeps on is
# struck once per this many refusals.
REFUSALS_PER_STRIKE = 10


@dataclass
class PeerStats:
    peer: str
    first_seen: float
    last_seen: float
    backend: str = ""
    dtype: str = ""
    name: str = ""  # chosen by the node's operator: untrusted, shown only as text
    reachability: str = "unknown"  # what the node's AutoNAT check found (it says so)
    route: str = ""  # how its last work request reached us: direct or relayed via <relay>
    # What the node says it runs on and measured itself: shown, never used
    # for sizing (``rate`` is the learner's own measure).
    device: str = ""
    memory_mib: int = 0
    tokens_per_s: float = 0.0
    held_version: int = -1
    assigned: int = 0  # prompts handed to it
    accepted: int = 0  # batches
    refused: int = 0
    rollouts: int = 0  # accepted
    tokens: int = 0  # accepted
    # Throughput while working: rollouts per (generation time the node reports
    # + the smallest recent overhead beyond it, from the later of assignment
    # and previous batch to verdict). Cycles that include fetching a new
    # version are thereby left out: that wait is the broadcast's, which the
    # capacity model counts separately.
    rate: float = 0.0
    cycle_s: float = 0.0
    answered_at: float = 0.0  # trio clock of its latest accepted batch
    overheads: deque[float] = field(default_factory=lambda: deque(maxlen=16))
    last_reason: str = ""
    strikes: deque[float] = field(default_factory=deque)
    # Strikes for prompts that lapsed: one per outage, forgiven by accepted work.
    lapses: deque[float] = field(default_factory=deque)
    banned_until: float = 0.0
    caught: str = ""  # why it was caught generating otherwise than it declares (echo_learner.verify.evidence)

    def to_json(self, now: float) -> dict:
        return {
            "peer": self.peer,
            "name": self.name,
            "backend": self.backend,
            "dtype": self.dtype,
            "device": self.device,
            "memory_mib": self.memory_mib,
            "tokens_per_s": round(self.tokens_per_s, 1),
            "held_version": self.held_version,
            "reachability": self.reachability,
            "route": self.route,
            "assigned": self.assigned,
            "accepted": self.accepted,
            "refused": self.refused,
            "rollouts": self.rollouts,
            "tokens": self.tokens,
            "rollouts_per_s": round(self.rate, 3),
            "last_seen_s": round(now - self.last_seen, 1),
            "last_reason": self.last_reason,
            "banned_for_s": round(max(0.0, self.banned_until - now), 1),
            "caught": self.caught,
        }


class PeerBook:
    def __init__(
        self,
        *,
        strikes_to_ban: int,
        strike_window_s: float,
        ban_s: float,
        max_peers: int,
        quiet_after_s: float = 0.0,
        on_forget: Callable[[str], None] | None = None,
    ):
        """``quiet_after_s``: a peer not seen for that long is back when seen
        again, which changes ``revision`` (0: every sighting does).
        ``on_forget`` is told of each peer dropped past ``max_peers``."""
        self.strikes_to_ban = strikes_to_ban
        self.strike_window_s = strike_window_s
        self.ban_s = ban_s
        self.max_peers = max_peers
        self.quiet_after_s = quiet_after_s
        # Least recently seen first: ``seen`` moves a peer to the end, so the
        # active ones are a tail of it (a learner asks on every work request).
        self.peers: OrderedDict[str, PeerStats] = OrderedDict()
        self.proven_seen_at = -math.inf  # when a peer with an accepted batch was last seen
        self.proven: set[str] = set()  # peers with an accepted batch
        # The others, kept beside it: newcomers are few in a swarm at work,
        # and what they hold is summed over them, not over every holder.
        self.unproven: set[str] = set()
        self.on_forget = on_forget
        # Changes whenever what admission sees changes (echo_learner.swarm.admission):
        # a peer new, forgotten or back after ``quiet_after_s``, a verdict.
        self.revision = 0
        self.changes = Changes()  # peers seen, judged or forgotten (echo_learner.swarm.admission)

    def seen(self, peer: str) -> PeerStats:
        now = time.time()
        quiet_since = now - self.quiet_after_s
        stats = self.peers.get(peer)
        if stats is None:
            stats = self.peers[peer] = PeerStats(peer, now, now)
            self.unproven.add(peer)
            self.revision += 1
            while len(self.peers) > self.max_peers:
                forgotten, _ = self.peers.popitem(last=False)
                self.proven.discard(forgotten)
                self.unproven.discard(forgotten)
                self.changes.note(forgotten)
                if self.on_forget is not None:
                    self.on_forget(forgotten)
        elif stats.last_seen <= quiet_since:
            self.revision += 1
        stats.last_seen = now
        self.changes.note(peer)
        self.peers.move_to_end(peer)
        if stats.accepted > 0:  # back after a quiet spell: counted above
            self.proven_seen_at = now
        return stats

    def on_work_request(self, peer: str, req: WorkRequest, route: str = "direct") -> None:
        stats = self.seen(peer)
        stats.backend, stats.dtype, stats.held_version = req.backend, req.dtype, req.held_version
        stats.name, stats.reachability, stats.route = req.name, req.reachability, route
        stats.device, stats.memory_mib, stats.tokens_per_s = req.device, req.memory_mib, req.tokens_per_s

    def on_verdict(
        self,
        peer: str,
        reason: str,
        rollouts: int,
        tokens: int,
        cycle_s: float | None = None,
        generate_s: float = 0.0,
    ) -> None:
        stats = self.seen(peer)
        stats.last_reason = reason
        self.revision += 1
        if reason == ACCEPTED:
            stats.accepted += 1
            self.proven.add(peer)
            self.unproven.discard(peer)
            stats.lapses.clear()  # back at work: its outages were no dishonesty
            self.proven_seen_at = stats.last_seen
            stats.rollouts += rollouts
            stats.tokens += tokens
            if cycle_s:
                stats.overheads.append(max(0.0, cycle_s - generate_s))
                work_s = max(generate_s + min(stats.overheads), 1e-3)
                stats.rate = running_mean(stats.rate, rollouts / work_s, EWMA)
                stats.cycle_s = running_mean(stats.cycle_s, work_s, EWMA)
            return
        stats.refused += 1
        if reason in STRIKES:
            self.strike(peer)

    def strike(self, peer: str) -> None:
        """One more strike; ``strikes_to_ban`` of them (lapses included) within
        the window ban the peer.

        A strike is no sign of life: a peer struck because its prompts lapsed
        must drop out of the ``active`` peers, or the learner sizes the
        round for it and hands its lapsed prompts to nobody else for
        another deadline (bench/convergence.py, sync: 72 s without a step)."""
        stats = self.peers.get(peer) or self.seen(peer)
        stats.strikes.append(time.time())
        self._ban_if_struck_out(stats)

    def lapsed(self, peer: str, deadline_s: float) -> None:
        """``peer`` let prompts expire unanswered: a strike, so that a peer
        that takes prompts and never answers is banned after a few deadlines.

        An honest node that crashes, sleeps or loses its link lets everything
        it holds lapse at once (an assignment, the next one fetched early,
        batches on their way), over a few seconds: lapses within one
        ``deadline_s`` of the last are that one outage. Its next accepted
        batch forgives them (``on_verdict``), so that a volunteer whose laptop
        went to sleep three times is not banned when it comes back."""
        event(log, logging.INFO, "prompts expired unanswered", peer=peer)
        stats = self.peers.get(peer) or self.seen(peer)
        now = time.time()
        if stats.lapses and now - stats.lapses[-1] < deadline_s:
            return
        stats.lapses.append(now)
        self._ban_if_struck_out(stats)

    def _ban_if_struck_out(self, stats: PeerStats) -> None:
        now = time.time()
        for strikes in (stats.strikes, stats.lapses):
            while strikes and strikes[0] < now - self.strike_window_s:
                strikes.popleft()
        if len(stats.strikes) + len(stats.lapses) >= self.strikes_to_ban:
            stats.banned_until = now + self.ban_s
            stats.strikes.clear()
            stats.lapses.clear()

    def banned(self, peer: str) -> bool:
        return self.ban_ends(peer) > time.time()

    def ban_ends(self, peer: str) -> float:
        """When ``peer``'s ban ends (in the past, or 0.0, when it is not banned)."""
        stats = self.peers.get(peer)
        return 0.0 if stats is None else stats.banned_until

    def active(self, within_s: float) -> list[PeerStats]:
        cutoff = time.time() - within_s
        recent = list(itertools.takewhile(lambda s: s.last_seen >= cutoff, reversed(self.peers.values())))
        return recent[::-1]

    def any_proven_active(self, within_s: float) -> bool:
        """Has a peer seen within ``within_s`` had a batch accepted? Kept as a
        time, not a scan: the prompt pool asks this for every holder on every request."""
        return self.proven_seen_at >= time.time() - within_s

    def to_json(self) -> list[dict]:
        now = time.time()
        return [s.to_json(now) for s in reversed(self.peers.values())]


class Newcomers:
    """Peers with no accepted batch yet, while a peer that has one asked for
    work within ``within_s``: the prompt pool hands them prompts beyond its
    capacity (``PromptPool.newcomers``; echo_learner/swarm/fairness.py caps what
    they hold together)."""

    def __init__(self, book: PeerBook, within_s: float):
        self.book = book
        self.within_s = within_s

    def __contains__(self, peer: object) -> bool:
        return peer not in self.book.proven and self.book.any_proven_active(self.within_s)

    def hold(self, held: Counter[str]) -> int:
        """What they hold together, of ``held``: summed over the peers with
        no accepted batch (few, once a swarm is at work), not over every
        holder (a learner asks at every change of the pool: at 1,000 peers,
        43 us against 2)."""
        if not self.book.any_proven_active(self.within_s):
            return 0
        return sum(held[p] for p in self.book.unproven if p in held)
