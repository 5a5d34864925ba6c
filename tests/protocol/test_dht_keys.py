"""DHT keys stay within what Kademlia peers accept, and unknown namespaces are refused."""

from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.peerinfo import PeerInfo
from libp2p.tools.anyio_service import background_trio_service

from protocol.host import make_host, parse_multiaddr
from protocol.identity import Identity
from protocol.ids import JOB_DIRECTORY_KEY, manifest_key, swarm_key
from protocol.messages import MAX_JOB_ID
from protocol.swarm import open_swarm

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def test_provider_keys_fit_kademlias_80_byte_limit_for_any_job_id():
    for job in ("a", "reverse-abc", "x" * MAX_JOB_ID, "ü" * MAX_JOB_ID):
        assert len(swarm_key(job).encode()) <= 80
    assert swarm_key("a") != swarm_key("b")
    assert len(JOB_DIRECTORY_KEY.encode()) <= 80
    assert len(manifest_key(Identity.generate().peer_id_str).encode()) <= 128


async def test_a_peer_cannot_store_records_under_namespaces_we_do_not_validate():
    async with open_swarm(Identity.generate(), [LOOPBACK], server=True) as ours:
        # A lax peer (py-libp2p's default) that stores anything and pushes it to us.
        other = make_host(Identity.generate(), [LOOPBACK])
        async with other.run([parse_multiaddr(LOOPBACK)]):
            lax = KadDHT(other, DHTMode.SERVER)
            async with background_trio_service(lax):
                await other.connect(PeerInfo(ours.host.get_id(), ours.host.get_addrs()))
                await lax.add_peer(ours.host.get_id())
                for key in ("/junk/abc", "/other-app/" + "y" * 60):
                    await lax.put_value(key, b"x" * 100)
                    assert lax.value_store.get(key.encode()) is not None  # the lax peer kept it
                    assert ours.dht.value_store.get(key.encode()) is None  # we did not
