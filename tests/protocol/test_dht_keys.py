"""DHT keys stay within what Kademlia peers accept, and unknown namespaces are refused."""

from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.peerinfo import PeerInfo
from libp2p.tools.anyio_service import background_trio_service

from protocol.identity import Identity
from protocol.ids import (
    JOB_DIRECTORY_KEY,
    MAX_FIND_NODE_KEY,
    RELAY_DIRECTORY_KEY,
    legacy_swarm_key,
    manifest_key,
    swarm_key,
)
from protocol.messages import MAX_JOB_ID
from protocol.net.host import make_host, parse_multiaddr
from protocol.net.swarm import open_swarm

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def test_every_key_we_use_fits_what_every_kademlia_answers_in_find_node():
    """Provider keys over 80 bytes are refused outright; a FIND_NODE on a key
    over 50 (what rust and go peers send first) is reset by py-libp2p."""
    keys = [JOB_DIRECTORY_KEY, RELAY_DIRECTORY_KEY, manifest_key(Identity.generate().peer_id_str)]
    keys += [swarm_key(job) for job in ("a", "reverse-abc", "x" * MAX_JOB_ID, "ü" * MAX_JOB_ID)]
    for key in keys:
        assert len(key.encode()) <= MAX_FIND_NODE_KEY, key
    assert len(swarm_key("reverse-abc")) == 46  # was 53 (legacy_swarm_key)
    assert len(legacy_swarm_key("reverse-abc")) == 53
    assert swarm_key("a") != swarm_key("b")


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


def test_what_peers_make_us_store_is_bounded():
    from libp2p.kad_dht.pb.kademlia_pb2 import Record
    from libp2p.kad_dht.provider_store import ProviderStore
    from libp2p.kad_dht.value_store import ValueStore

    from protocol.net.dht_limits import bound_provider_store, bound_value_store

    host = make_host(Identity.generate(), [LOOPBACK])
    values = ValueStore(host, host.get_id())
    bound_value_store(values, max_bytes=10_000)
    for i in range(50):
        values.put_record(f"/echo-swarm/k{i}".encode(), Record(key=b"k", value=b"x" * 1000))
    assert sum(len(r.value) for r, _ in values.store.values()) <= 10_000
    assert b"/echo-swarm/k49" in values.store and b"/echo-swarm/k0" not in values.store  # oldest go first

    providers = ProviderStore(host)
    bound_provider_store(providers, max_keys=8, max_per_provider=3)
    spammer = PeerInfo(Identity.generate().peer_id, [parse_multiaddr("/ip4/127.0.0.1/tcp/1")])
    for i in range(10):
        providers.add_provider(f"junk{i}".encode(), spammer)
    assert sum(str(spammer.peer_id) in p for p in providers.providers.values()) == 3
    honest = [PeerInfo(Identity.generate().peer_id, [parse_multiaddr("/ip4/127.0.0.1/tcp/2")]) for _ in range(8)]
    for i, peer in enumerate(honest):
        providers.add_provider(f"key{i}".encode(), peer)
    assert len(providers.providers) == 8  # the stalest keys made room


def test_job_directory_announcements_not_renewed_within_their_ttl_are_not_offered():
    """A learner long gone is not offered to joining nodes, nor holds one of
    the 20 places py-libp2p keeps per key against a live learner."""
    from libp2p.kad_dht.provider_store import ProviderStore

    from protocol.ids import JOB_DIRECTORY_TTL_S, swarm_key
    from protocol.net.dht_limits import bound_provider_store

    host = make_host(Identity.generate(), [LOOPBACK])
    providers = ProviderStore(host)
    bound_provider_store(providers)
    directory, swarm = JOB_DIRECTORY_KEY.encode(), swarm_key("reverse-abc").encode()
    gone = [PeerInfo(Identity.generate().peer_id, [parse_multiaddr(f"/ip4/127.0.0.1/tcp/{i + 1}")]) for i in range(20)]
    for info in gone:
        providers.add_provider(directory, info)
        providers.add_provider(swarm, info)
    assert len(providers.get_providers(directory)) == 20
    for key in (directory, swarm):  # announced a TTL ago and never again
        for record in providers.providers[key].values():
            record.timestamp -= JOB_DIRECTORY_TTL_S + 1
    assert providers.get_providers(directory) == []
    assert len(providers.get_providers(swarm)) == 20  # other keys keep py-libp2p's lifetime
    live = PeerInfo(Identity.generate().peer_id, [parse_multiaddr("/ip4/127.0.0.1/tcp/99")])
    for info in gone:  # stale again, then a live learner announces
        providers.add_provider(directory, info)
        providers.providers[directory][str(info.peer_id)].timestamp -= JOB_DIRECTORY_TTL_S + 1
    providers.add_provider(directory, live)
    assert [p.peer_id for p in providers.get_providers(directory)] == [live.peer_id]
