"""Reachability upkeep: whether other peers can dial this node, and what
follows from the answer.

The bootstrap peers and the learner are asked to dial us back (AutoNAT,
``protocol.net.reachability``), now and every ``reachability_every_s``. The
addresses they dialled are advertised; behind NAT a relay reservation makes
us reachable to other peers; a public node that relays (``--relay``) tells
them where it is through the DHT's relay directory.
"""

from __future__ import annotations

import logging

import trio
from libp2p.peer.id import ID

from echo_node.config import NodeConfig
from protocol.ids import RELAY_DIRECTORY_KEY
from protocol.net.host import parse_peer_addr
from protocol.net.reachability import PRIVATE, PUBLIC, Reachability, check_reachability
from protocol.net.swarm import Swarm, advertise_dialled, announce
from protocol.process.logs import event

log = logging.getLogger(__name__)


class ReachabilityWatch:
    """The latest answer (``current``), kept up to date by ``run``."""

    def __init__(self, config: NodeConfig):
        self.config = config
        self.current = Reachability()  # unknown until the first answer

    async def run(self, swarm: Swarm, learner: ID) -> None:
        """Check now and every ``reachability_every_s`` until cancelled; log
        when the answer changes."""
        cfg = self.config
        servers = [parse_peer_addr(a).peer_id for a in cfg.bootstrap] + [learner]
        while True:
            found = await check_reachability(swarm.host, servers, cfg.request_timeout_s)
            if found.status != self.current.status:
                event(log, logging.WARNING, f"reachability: {found.describe()}", answers=found.answers)
            self.current = found
            advertise_dialled(swarm, found)
            # Behind NAT, a relay reservation makes us reachable to other
            # peers; a public node that relays tells them where it is.
            assert swarm.relay is not None
            swarm.relay.want(found.status == PRIVATE)
            if found.status == PUBLIC and cfg.relay:
                await announce(swarm, RELAY_DIRECTORY_KEY, cfg.request_timeout_s)
            await trio.sleep(cfg.reachability_every_s)
