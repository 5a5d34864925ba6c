"""What the learner answers a work request (the protocol itself:
``protocol.wire.work``).

Prompts out of the pool as soon as the node may have some (admission: how
many, with which version, ``admission``, ``sizing``, ``fairness``), else a
long poll until the pool changes, or at once a NoWork with a time to come
back when the learner is at capacity or too many requests wait. Runs under
``protocol.rpc.serve`` (deadline, per-peer error logging, stream cleanup).
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import Counter

import trio
from libp2p.abc import INetStream

from echo_learner.config import LearnerConfig
from echo_learner.ledger import now_ms
from echo_learner.swarm import fairness
from echo_learner.swarm.admission import Admission
from echo_learner.swarm.capacity import window_left_s
from echo_learner.swarm.loop_lag import LoopLag
from echo_learner.swarm.peers import REFUSALS_PER_STRIKE, PeerBook, PeerStats
from echo_learner.swarm.pool import Assignment, PromptPool
from echo_learner.swarm.sizing import DEADLINE_SHARE, Worker, prompts_for
from echo_learner.verify.verifier import Verifier
from protocol.messages import UNKNOWN_JOB, ErrorReply
from protocol.rpc import remote_peer, route
from protocol.wire import work
from protocol.wire.work import NoWork, Prompt, WorkAssignment, WorkRequest

# The longest a busy learner tells a node to wait before asking again.
MAX_RETRY_S = 60.0
BANNED_WHY = "too many strikes (refused batches, prompts left unanswered); try again later"


class WorkHandler:
    def __init__(self, config: LearnerConfig, *, verifier: Verifier, pool: PromptPool, peers: PeerBook, lag: LoopLag):
        """``lag``: the learner's event-loop lag, which says when it is at capacity."""
        self.config = config
        self.verifier = verifier
        # Work is handed out under what batches are checked against: the
        # verifier's limits, versions and meter, so that they cannot differ.
        self.limits = verifier.limits
        self.job_id = verifier.limits.job_id
        self.current_version = verifier.current_version
        self.meter = verifier.meter
        self.pool = pool
        self.peers = peers
        self.lag = lag
        self.admission = Admission(pool, peers, within_s=config.assignment_timeout_s, group_size=config.group_size)
        self._asking: Counter[str] = Counter()  # work requests under way per peer
        self._waiting = 0  # work requests waiting for the pool to change
        # When the requests turned away for a full waiting room are due back
        # (trio clock, a heap; at most max_peers_tracked).
        self._coming_back: list[float] = []
        # Work requests refused for being over the limit, per peer (bounded:
        # cleared past max_peers_tracked peers).
        self._refusals: Counter[str] = Counter()

    async def handle(self, stream: INetStream) -> None:
        peer, via = remote_peer(stream), route(stream.muxed_conn)
        await work.answer(stream, lambda req: self.reply(peer, via, req))

    async def reply(self, peer: str, via: str, req: WorkRequest) -> work.Reply:
        """The answer to ``peer``'s work request ``req`` (it came ``via`` a direct or relayed connection)."""
        self.peers.on_work_request(peer, req, via)
        if self.peers.banned(peer):  # first: told so, it is then disconnected (service.py)
            return ErrorReply(work.BANNED, BANNED_WHY)
        if req.job_id != self.job_id:
            return ErrorReply(UNKNOWN_JOB, f"this learner runs {self.job_id}")
        if self.lag.lag_s * 1000 > self.config.busy_lag_ms:
            return NoWork(
                self.job_id,
                max(self.current_version(), 0),
                retry_after_ms=self._busy_retry_ms(),
                reason="busy: the learner is at capacity; ask again after retry_after_ms",
            )
        if self._asking[peer] >= self.config.max_work_requests:
            # An honest node never gets here; a peer that keeps trying does,
            # and each REFUSALS_PER_STRIKE-th refusal is a strike.
            if len(self._refusals) >= self.config.max_peers_tracked:
                self._refusals.clear()
            self._refusals[peer] += 1
            if self._refusals[peer] % REFUSALS_PER_STRIKE == 0:
                self.peers.strike(peer)
            return ErrorReply(
                work.TOO_MANY_REQUESTS, f"at most {self.config.max_work_requests} work requests at a time"
            )
        self._asking[peer] += 1
        try:
            return await self._long_poll(peer, req)
        finally:
            self._asking[peer] -= 1
            if not self._asking[peer]:
                del self._asking[peer]

    def _busy_retry_ms(self) -> int:
        """When a request turned away at capacity should come back: a long
        poll's time, longer the later the loop runs, spread over +-25 %."""
        cfg = self.config
        wait_s = cfg.long_poll_s * self.lag.lag_s * 1000 / cfg.busy_lag_ms
        return int(min(max(wait_s, 1.0), MAX_RETRY_S) * random.uniform(0.75, 1.25) * 1000)

    def _retry_after_ms(self) -> int:
        """When a request turned away for a full waiting room should come back:
        about when the prompts for those ahead of it have been handed out at
        the learner's measured pace (a step's prompts a step), spread over
        +-25 % so that they do not all come back in the same second. Ahead of
        it: the waiting requests, and those turned away before it that are
        not back yet. Counting only the waiting ones, a crowd of 1,000 on a
        full pool was sent back every few seconds, 140 answers a second
        that gave nobody work."""
        cfg, meter, now = self.config, self.meter, trio.current_time()
        while self._coming_back and self._coming_back[0] <= now:
            heapq.heappop(self._coming_back)
        per_s = cfg.prompts_per_step / meter.step_period_s if meter.step_period_s > 0 else 0.0
        ahead = self._waiting + len(self._coming_back)
        wait_s = ahead / per_s if per_s > 0 else cfg.long_poll_s
        retry_s = min(max(wait_s, 1.0), MAX_RETRY_S) * random.uniform(0.75, 1.25)
        if len(self._coming_back) < cfg.max_peers_tracked:
            heapq.heappush(self._coming_back, now + retry_s)
        return int(retry_s * 1000)

    async def _long_poll(self, peer: str, req: WorkRequest) -> work.Reply:
        """Answer ``req`` with prompts as soon as ``peer`` may have some, or with
        NoWork after ``long_poll_s`` (at once, with a time to come back, when
        ``max_waiting_requests`` are waiting already: each waiting request
        looks again at every change of the pool, which costs the learner more
        than a quick answer when a crowd waits)."""
        with trio.move_on_after(self.config.long_poll_s):
            while True:
                if self.peers.banned(peer):  # checked again after each wait: bans come mid-wait
                    return ErrorReply(work.BANNED, BANNED_WHY)
                version = self.current_version()
                held = self.pool.held()  # prompts each peer holds unanswered
                oldest, in_window_s = self._version_for(peer, req, held[peer])
                wanted = min(req.max_prompts, self._sized_for(peer, in_window_s, held), self._room_for(peer, held))
                taken = self.pool.take(peer, wanted, version) if wanted else []
                if taken:
                    self.peers.seen(peer).assigned += len(taken)
                    return self._assignment(version, oldest, taken)
                if self._waiting >= self.config.max_waiting_requests:
                    return NoWork(
                        self.job_id,
                        max(version, 0),
                        retry_after_ms=self._retry_after_ms(),
                        reason="busy: too many waiting; ask again after retry_after_ms",
                    )
                self._waiting += 1
                try:
                    if peer in self.pool.newcomers:
                        # A newcomer looks again only every newcomer_retry_s: a
                        # crowd of them woken at every pool change would cost the
                        # learner more than they bring.
                        await trio.sleep(self.config.newcomer_retry_s)
                        continue
                    # An expiring prompt frees room too, and nothing announces it.
                    # With ``wanted``, it may have prompts but the pool has none
                    # to hand out (shut, or full): only room in the pool helps.
                    with trio.move_on_at(self.pool.next_expiry() + 0.01):
                        await self.pool.wait_changed(room=wanted > 0)
                finally:
                    self._waiting -= 1
        return NoWork(self.job_id, max(self.current_version(), 0), retry_after_ms=0, reason="no prompts open")

    def _version_for(self, peer: str, req: WorkRequest, holds: int) -> tuple[int, float]:
        """Admission control (async mode): the oldest version ``peer`` may
        generate its next prompts with, and the seconds until the version it
        will use leaves the staleness window at the learner's measured pace
        (inf in sync mode, or before the pace is measured).

        The version it holds, if that stays in the window long enough for
        what it holds plus one more prompt (at its measured rate, with the
        deadline's margin; it holds ``holds``): then any in the window will do. Else the oldest
        newer one that stays long enough once fetched (a broadcast's time),
        or at worst the current one. Handing a node prompts to make with a
        version about to leave cost 1.2 % of honest batches
        (bench/convergence.py): they arrived out of the window."""
        cfg, meter, window = self.config, self.meter, self.verifier.window()
        if cfg.staleness_in_force == 0 or meter.step_period_s <= 0:
            return window.lo, math.inf
        current, need_s = self.current_version(), self._one_more_s(peer, holds)

        def left_s(version: int) -> float:
            return window_left_s(
                version=version,
                current=current,
                staleness=cfg.staleness_in_force,
                publish_every=cfg.publish_every,
                steps_since=meter.steps_since_publish,
                step_period_s=meter.step_period_s,
                since_publish_s=time.monotonic() - meter.last_published,
                broadcast_s=meter.broadcast_s,
            )

        if req.held_version in window and (held_s := left_s(req.held_version)) >= need_s:
            return window.lo, held_s
        for version in range(max(window.lo, req.held_version + 1), current + 1):
            fetched_s = left_s(version) - meter.broadcast_s
            if fetched_s >= need_s or version == current:
                return version, max(0.0, fetched_s)
        return current, 0.0  # it holds a version newer than ours (a learner restarted from an older checkpoint)

    def _one_more_s(self, peer: str, holds: int) -> float:
        """Seconds ``peer`` needs for the ``holds`` prompts it holds and one more, at its
        measured rate, within the share of a deadline its work may fill
        (0 before its rate is measured)."""
        stats = self.peers.peers.get(peer)
        if stats is None or stats.rate <= 0:
            return 0.0
        return (holds + 1) * self.config.group_size / stats.rate / DEADLINE_SHARE

    def _sized_for(self, peer: str, in_window_s: float, held: Counter[str]) -> int:
        """Prompts ``peer`` finishes by the end of the round and well inside
        the deadline (echo_learner.swarm.sizing); in async mode the deadline is
        also the version it will use leaving the window in ``in_window_s``
        (admission control: work it cannot return in time is not handed out)."""
        cfg = self.config
        if not cfg.size_work:
            return cfg.prompts_per_request
        stats = self.peers.peers.get(peer)
        now = trio.current_time()
        round_ends_in_s = self.admission.view().round_ends_in_s(now)
        return prompts_for(
            stats.rate if stats else 0.0,
            min(cfg.assignment_timeout_s, in_window_s),
            cfg.group_size,
            cfg.prompts_per_request,
            held=held[peer],
            busy_s=self._worker(stats, held, self.pool.held_since(), now).busy_s if stats and stats.rate > 0 else 0.0,
            round_ends_in_s=round_ends_in_s,
            handed_this_round=self.pool.handed(peer),
        )

    def _worker(self, s: PeerStats, held: Counter[str], since: dict[str, float], now: float) -> Worker:
        """``s``'s node as the round's model sees it: busy with what it holds
        from the later of its oldest prompt and its latest answer."""
        rate = s.rate / self.config.group_size
        busy_s = max(0.0, max(since.get(s.peer, now), s.answered_at) + held[s.peer] / rate - now)
        return Worker(rate, busy_s)

    def _room_for(self, peer: str, held: Counter[str]) -> int:
        """How many more prompts ``peer`` may hold now (echo_learner.swarm.fairness)."""
        view = self.admission.view()
        return fairness.room(
            peer,
            capacity=self.pool.capacity,
            per_request=self.config.prompts_per_request,
            newcomer_share=self.config.newcomer_share,
            active=view.active,
            proven=view.proven,
            held=held,
            newcomers_hold=view.newcomers_hold,
        )

    def _assignment(self, version: int, oldest: int, taken: list[Assignment]) -> WorkAssignment:
        cfg = self.config
        return WorkAssignment(
            job_id=self.job_id,
            version=version,
            min_version=oldest,
            prompts=tuple(Prompt(a.prompt_id, a.tokens) for a in taken),
            group_size=cfg.group_size,
            max_new_tokens=self.limits.max_new_tokens,
            temperature=self.limits.temperature,
            stop_token_ids=tuple(sorted(self.limits.stop_ids)),  # what check_batch holds nodes to
            deadline_ms=now_ms() + int(cfg.assignment_timeout_s * 1000),
        )
