"""Finding broadcast neighbours: DHT provider records of the job's swarm key.

Every engine announces itself under the job's provider keys (``swarm_keys``:
the current one and, until protocol version 2, the legacy one) and looks up
the others there, dialling those it has no have-stream with yet. The lookups
back off (doubling up to ``discover_max_interval_s``) while nothing new turns
up, and slow down once the engine has all the neighbours it may have.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection

import trio
from libp2p.peer.peerinfo import PeerInfo

from protocol.broadcast.settings import BroadcastConfig
from protocol.ids import swarm_keys
from protocol.net.swarm import Swarm, announce, providers_of
from protocol.process.logs import event

log = logging.getLogger(__name__)


async def discover_neighbours(
    swarm: Swarm,
    job_id: str,
    config: BroadcastConfig,
    neighbours: Collection[str],
    max_neighbours: int,
    connect: Callable[[PeerInfo], Awaitable[None]],
    nursery: trio.Nursery,
) -> None:
    """Runs until cancelled; ``connect`` is started in ``nursery`` for each
    peer to dial, ``neighbours`` is read live."""
    me = swarm.host.get_id().to_base58()
    keys = swarm_keys(job_id)
    provided: set[str] = set()
    interval = config.discover_interval_s
    known: set[str] = set()
    unconnected: set[str] = set()
    while True:
        # (Re-)announce whenever our addresses change: a relay reservation
        # gained or lost changes how others can reach us.
        addrs = {str(a) for a in swarm.host.get_addrs()}
        if addrs != provided and all([await announce(swarm, key, config.request_timeout_s) for key in keys]):
            provided = addrs
        found = await providers_of(swarm, keys, config.request_timeout_s)
        event(log, logging.DEBUG, "swarm peers found", peers={p[-6:]: len(i.addrs) for p, i in found.items()})
        missing = {p for p in found if p != me and p not in neighbours}
        for peer in missing:
            # The smaller peer id dials first, so two peers that find each
            # other rarely open two have-streams at once; the larger one
            # dials too if the other has not within one round (its own
            # discovery may be sleeping).
            if me < peer or peer in unconnected:
                nursery.start_soon(connect, found[peer])
        unconnected = missing
        new = set(found) - known
        known |= new
        others = len(found) - (me in found)
        if len(neighbours) >= min(max_neighbours, others):
            interval = config.discover_max_interval_s
        elif new:
            interval = config.discover_interval_s
        else:
            interval = min(interval * 2, config.discover_max_interval_s)
        # A periodic refresh of the neighbour set, not synchronisation.
        await trio.sleep(interval)
