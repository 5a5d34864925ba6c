"""The download loop: the chunks of the version followed, from neighbours.

``scheduler.Download`` decides which chunk to ask of whom and when to give
up; ``requests.ChunkRequests`` runs each request. A request that makes no
progress for ``stall_s`` (or brings no byte in a few typical request times,
``Download.request_timeout``) is cancelled and reissued elsewhere, and its
peer dropped for that version and struck (the learner only rests: it is busy,
not hostile); ``stalls_to_ban`` strikes, a chunk that fails its hash, or a
denied chunk the peer announces, ban the peer from our downloads for
``ban_s`` (``penalties``). A request overtaken by another holder's endgame
copy is no stall; one to a peer that has never sent us a good chunk, with no
byte yet, runs on to find out whether it answers (``ChunkRequests.request``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

import trio

from protocol.broadcast import bitfield
from protocol.broadcast import requests as outcomes
from protocol.broadcast.penalties import Penalties
from protocol.broadcast.reciprocity import Standing
from protocol.broadcast.requests import ChunkRequests
from protocol.broadcast.scheduler import Download
from protocol.broadcast.state import PEER_ERRORS, EngineState
from protocol.errors import ProtocolError
from protocol.manifest import manifest_digest
from protocol.messages import Manifest
from protocol.models import updates
from protocol.process.logs import event
from protocol.wire import chunk
from protocol.wire.have import Have

log = logging.getLogger(__name__)

# Peers remembered as having served us a good chunk (then forgotten at once).
MAX_TRUSTED = 4096


class Downloads:
    def __init__(
        self,
        state: EngineState,
        *,
        requests: ChunkRequests,
        standing: Standing,
        on_complete: Callable[[Manifest], None],
    ):
        """``standing``: our record of what each peer gave us (a good chunk
        counts for it); ``on_complete(m)``: ``m``'s version is held in full."""
        self.state = state
        self.requests = requests
        self.standing = standing
        self.on_complete = on_complete
        self.penalties = Penalties(state.config, state.stats, on_ban=self._on_ban)
        self._rng = random.Random()

    def banned(self, peer: str) -> bool:
        return self.penalties.banned(peer)

    def start(self, m: Manifest) -> None:
        """Download ``m``'s version from now on."""
        s = self.state
        s.target = m
        if s.queued is not None and s.queued.version <= m.version:
            s.queued = None
        s.download = Download(
            n_chunks=len(m.chunk_hashes),
            have=set(s.store.chunks_held(m.version)),
            seed=s.learner_id,
            config=s.config.scheduler,
            rng=self._rng,
            relayed=s.relayed,
            trusted=s.trusted,
            records=s.records,
            rested=s.download.busy_strangers() if s.download is not None else {},
        )
        for peer, latest in s.neighbours.items():
            if latest is not None:
                self.apply_have(peer, latest)
        s.poke_local()

    def apply_have(self, peer: str, latest: Have) -> None:
        """What ``peer``'s Have says it holds of the version we download."""
        s = self.state
        m, d = s.target, s.download
        if m is None or d is None:
            return
        if latest.version != m.version or m.format in updates.VARIANTS and peer == s.learner_id:
            if self._holds_as_base(peer, latest, m) and not self.banned(peer):
                # Following an update against m means holding m in full.
                d.update_peer(peer, frozenset(range(len(m.chunk_hashes))))
                s.poke_downloader()
            return
        if self.banned(peer):
            d.drop(peer)
            return
        if latest.manifest_digest != manifest_digest(m):
            return  # same number, other weights (e.g. a restarted run): not ours
        try:
            d.update_peer(peer, bitfield.decode(latest.bitfield, len(m.chunk_hashes)))
        except ProtocolError as exc:
            event(log, logging.INFO, "bad have", peer=peer, error=exc)
            return
        s.poke_downloader()

    async def forget(self, peer: str) -> None:
        """``peer`` is no neighbour any more: nothing more is asked of it."""
        await self.requests.forget(peer)
        if self.state.download is not None:
            self.state.download.remove_peer(peer)
        self.state.poke_downloader()

    async def loop(self) -> None:
        """Runs until cancelled: issues each request the scheduler wants, when it wants it."""
        s = self.state
        async with trio.open_nursery() as nursery:
            while True:
                wake = s.wake_downloader
                d, m = s.download, s.target
                deadline = float("inf")
                if d is not None and m is not None and not d.complete:
                    now = trio.current_time()
                    for peer, idx in d.next_requests(now):
                        nursery.start_soon(self._fetch_chunk, d, m, peer, idx)
                    deadline = d.next_wakeup(now)
                    self.requests.retime(d)
                with trio.move_on_at(deadline):
                    await wake.wait()

    async def _fetch_chunk(self, d: Download, m: Manifest, peer: str, idx: int) -> None:
        s = self.state
        outcome = outcomes.FAILED
        try:
            outcome = await self.requests.request(
                m,
                peer,
                idx,
                d.request_timeout(peer),
                guessed=s.download is None or not s.download.durations,
                is_neighbour=s.neighbours.__contains__,
                announces=self._announces,
                trusted=self._vouched,
            )
        except PEER_ERRORS as exc:
            event(log, logging.DEBUG, "chunk request failed", peer=peer, idx=idx, error=exc)
        now = trio.current_time()
        event(log, logging.DEBUG, "chunk request ended", peer=peer[-6:], idx=idx, outcome=outcome)
        if outcome == outcomes.OK:
            d.on_done(peer, idx, now)
            if len(s.trusted) >= MAX_TRUSTED:
                s.trusted.clear()
            s.trusted.add(peer)
            self.standing.note_served_us(peer, now)
            self.requests.cancel_copies(idx, done_by=peer)
            if s.store.complete(m.version):
                s.stats.completed_at.setdefault(m.version, time.time())
                self.on_complete(m)
            s.poke_local()
        else:
            if outcome == outcomes.BAD:
                s.stats.banned.append((peer, m.version))
                self.penalties.ban(peer, "sent a chunk that failed its hash", version=m.version, chunk=idx)
            elif outcome == outcomes.DENIED:
                self.penalties.ban(peer, "denied a chunk it announces", version=m.version, chunk=idx)
            elif outcome == outcomes.STALLED and not self.banned(peer) and peer != s.learner_id:
                self.penalties.strike(peer)
            d.on_failed(
                peer,
                idx,
                now,
                bad=outcome in (outcomes.BAD, outcomes.DENIED),
                stalled=outcome == outcomes.STALLED,
                busy=outcome == chunk.BUSY,
                declined=outcome == chunk.ASK_OTHERS,
                overtaken=outcome == outcomes.OVERTAKEN,
            )
            s.poke_downloader()

    def _vouched(self, peer: str) -> bool:
        """Has ``peer`` sent us a good chunk, and more good chunks than
        requests to it failed? Only then is its request that another copy
        overtook let off as slower this once; a doubtful peer's runs on to
        its verdict. (A trickler's requests were all overtaken by the copies
        they drew, before its first byte: it was never struck, issue 55.)"""
        return peer in self.state.trusted and not self.state.records.doubtful(peer)

    def _on_ban(self, peer: str) -> None:
        if self.state.download is not None:
            self.state.download.drop(peer)

    def _holds_as_base(self, peer: str, latest: Have, m: Manifest) -> bool:
        """Does ``peer`` hold ``m`` in full, following a newer version? Its Have
        names the base it holds (engines fetch an update only once they hold
        its base in full); the learner holds what it published and keeps,
        variants and versions it has moved past alike. (A learner restarted
        while a chunk of v1 was only its own announced v2 at once: nodes
        finishing v1, half done, found no holder of that chunk and waited
        for ever. One it dropped answers ``unknown_chunk``: a failed
        request, asked elsewhere.)"""
        if peer == self.state.learner_id:
            return latest.version >= m.version
        return latest.version > m.version and latest.base_digest == manifest_digest(m)

    def _announces(self, peer: str, m: Manifest, idx: int) -> bool:
        """Does ``peer``'s latest Have still name chunk ``idx`` of ``m``?"""
        latest = self.state.neighbours.get(peer)
        if latest is None or latest.version != m.version or latest.manifest_digest != manifest_digest(m):
            return False
        byte = idx // 8
        return len(latest.bitfield) > byte and bool(latest.bitfield[byte] >> (idx % 8) & 1)
