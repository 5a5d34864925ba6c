"""How nodes find this learner's job in the DHT: the job directory key names
the learner as a provider, and the newest signed manifest sits under the
learner's manifest key, so that a joining node knows what to fetch.

A DHT put waits on the peers closest to the key, and one that answers slowly
(any stranger can join the DHT) held every training step for up to
``DHT_TIMEOUT_S``: so ``keep_manifest`` puts each new manifest off the
training loop, skipping versions published meanwhile (the newest goes next).

It puts at most one manifest every ``put_interval_s``: a put asks each of
the key's closest peers twice (find them, then store), and the record is
read only by nodes looking for a job; running nodes learn each version from
their neighbours' Haves and fetch its manifest from the learner. Put at
every version, the puts were ~18 % of the learner's event-loop CPU in a
sync swarm of three nodes, and grew with every DHT peer that joined: four
chunk peers that announced and never served made them +27 ms of learner CPU
per accepted batch (bench/attacks.py stalling_chunk_peers, py-spy,
2026-11-29).
"""

from __future__ import annotations

import logging

import trio

from protocol.ids import JOB_DIRECTORY_KEY, JOB_DIRECTORY_REFRESH_S, manifest_keys
from protocol.net.swarm import Swarm
from protocol.process.logs import event

log = logging.getLogger(__name__)

DHT_TIMEOUT_S = 10.0


class JobDirectory:
    def __init__(self, swarm: Swarm, learner: str, put_interval_s: float):
        self.swarm = swarm
        self.learner = learner
        self.put_interval_s = put_interval_s
        self._unput: tuple[int, bytes] | None = None  # the newest manifest not yet in the DHT
        self._unput_changed = trio.Event()

    async def announce(self) -> None:
        """Name this learner as a provider of the job directory key."""
        with trio.move_on_after(DHT_TIMEOUT_S) as scope:
            ok = await self.swarm.dht.provide(JOB_DIRECTORY_KEY)
        if scope.cancelled_caught or not ok:
            event(log, logging.WARNING, "could not announce the job in the DHT yet")

    async def keep_announced(self) -> None:
        """Announce again every ``JOB_DIRECTORY_REFRESH_S`` (our DHT peers
        forget an announcement after ``JOB_DIRECTORY_TTL_S``); runs until cancelled."""
        while True:
            await trio.sleep(JOB_DIRECTORY_REFRESH_S)
            await self.announce()

    def published(self, version: int, encoded_manifest: bytes) -> None:
        """A new version is out: its manifest goes into the DHT next."""
        self._unput = (version, encoded_manifest)
        self._unput_changed.set()

    async def keep_manifest(self) -> None:
        """Put the newest manifest in the DHT, at most once every
        ``put_interval_s``; runs until cancelled."""
        while True:
            await self._unput_changed.wait()
            self._unput_changed = trio.Event()
            await self.put_manifest()
            await trio.sleep(self.put_interval_s)  # a rate limit: what is published meanwhile waits

    async def put_manifest(self) -> None:
        """Put the newest manifest not yet in the DHT, now."""
        if self._unput is None:
            return
        (version, encoded), self._unput = self._unput, None
        # Under the hashed key and, until protocol version 2, the old one
        # too: nodes of earlier releases read only that (protocol.ids).
        for key in manifest_keys(self.learner):
            with trio.move_on_after(DHT_TIMEOUT_S) as scope:
                await self.swarm.dht.put_value(key, encoded)
            if scope.cancelled_caught:
                event(log, logging.WARNING, "DHT put of the manifest timed out", version=version, key=key)
