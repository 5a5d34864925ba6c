"""A node whose port a router forwards (UPnP or by hand) advertises the
address a dial-back reached it at, and only while it is public."""

from __future__ import annotations

from protocol.identity import Identity
from protocol.net.reachability import PRIVATE, PUBLIC, Reachability
from protocol.net.swarm import advertise_dialled, open_swarm

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


async def test_dialled_addresses_are_advertised_while_public():
    identity = Identity.generate()
    async with open_swarm(identity, [LOOPBACK], server=False) as swarm:
        listen = [str(a) for a in swarm.host.get_addrs()]
        (own,) = [a.split("/p2p/")[0] for a in listen]
        forwarded = "/ip4/10.77.0.14/tcp/4001"

        advertise_dialled(swarm, Reachability(PUBLIC, dialled=[own, forwarded]))
        addrs = [str(a) for a in swarm.host.get_addrs()]
        # The forwarded address joins the listen address, once, with our id.
        assert addrs == [*listen, f"{forwarded}/p2p/{identity.peer_id_str}"]
        advertise_dialled(swarm, Reachability(PUBLIC, dialled=[forwarded]))
        assert [str(a) for a in swarm.host.get_addrs()] == addrs

        advertise_dialled(swarm, Reachability(PRIVATE))
        assert [str(a) for a in swarm.host.get_addrs()] == listen
