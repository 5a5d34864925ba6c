"""A real rust-libp2p peer against ours: lattica 1.0.21 (PyPI; rust-libp2p's
Kademlia, identify and Noise behind Python bindings) joins our DHT through a
real ``echo-bootstrap`` process, announces itself under a job's swarm key and
finds a learner's job directory announcement; our DHT asks it directly too.

lattica keeps only peers whose identify protocolVersion equals its own, and
speaks Kademlia on that same value as a stream protocol id: it is
configured with ours (``protocol.net.identify``). Its calls block (its own
tokio runtime answers them), so they run in threads.
"""

import socket

import trio
from lattica import Lattica
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from protocol.identity import Identity
from protocol.ids import JOB_DIRECTORY_KEY, swarm_key
from protocol.net import identify
from protocol.net.host import parse_multiaddr
from protocol.net.swarm import announce, connect_bootstrap, find_providers, open_swarm

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def rust_peer(bootstrap: str) -> tuple[Lattica, str]:
    """A lattica peer bootstrapped to ``bootstrap``, and its listen address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    addr = f"/ip4/127.0.0.1/tcp/{port}"
    peer = (
        Lattica.builder()
        .with_bootstraps([bootstrap])
        .with_listen_addrs([addr])
        # rust-libp2p names only its external addresses in ADD_PROVIDER, and
        # py-libp2p drops a provider that comes with none.
        .with_external_addrs([addr])
        .with_protocol(identify.PROTOCOL_VERSION)
        .with_mdns(False)
        .with_upnp(False)
        .with_autonat(False)
        .with_dcutr(False)
        .build()
    )
    return peer, addr


async def until(check, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    """Poll ``check`` (lattica has no event to wait on) until it returns something true."""
    with trio.move_on_after(timeout_s):
        while True:
            result = await check()
            if result:
                return result
            await trio.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what}")


async def test_a_rust_libp2p_peer_joins_a_job_swarm_and_finds_the_job_directory_through_our_bootstrap(swarm_factory):
    bootstrap = swarm_factory.start_bootstrap()
    bootstrap_id = bootstrap.rsplit("/p2p/", 1)[1]
    rust, rust_addr = await trio.to_thread.run_sync(rust_peer, bootstrap)
    try:

        async def rust_peers() -> list[str]:
            return await trio.to_thread.run_sync(rust.get_all_peers)

        await until(lambda: _contains(rust_peers(), bootstrap_id), 20, "the rust peer to connect to our bootstrap")
        key = swarm_key("reverse-test")
        await trio.to_thread.run_sync(rust.start_providing, key)

        async with open_swarm(Identity.generate(), [LOOPBACK], server=True) as ours:
            assert await connect_bootstrap(ours, [bootstrap], 10) == 1

            # Its FIND_NODE and ADD_PROVIDER reached our bootstrap, and our lookup finds it there.
            found = await until(
                lambda: _contains(find_providers(ours, key, 5), rust.peer_id()), 30, "our lookup to find the rust peer"
            )
            assert found

            # Our announcement on the job directory is what its lookup finds.
            await announce(ours, JOB_DIRECTORY_KEY, 10)
            with trio.fail_after(30):
                providers = await trio.to_thread.run_sync(rust.get_providers, JOB_DIRECTORY_KEY)
            assert ours.host.get_id().to_base58() in providers

            # Our DHT's own request to it (GET_PROVIDERS on /ipfs/kad/1.0.0) is answered.
            rust_id = ID.from_base58(rust.peer_id())
            await ours.host.connect(PeerInfo(rust_id, [parse_multiaddr(rust_addr)]))
            with trio.fail_after(10):
                answer, _ = await ours.dht.provider_store._get_providers_from_peer_with_closers(rust_id, key.encode())
            assert rust_id in [info.peer_id for info in answer]

            # Identify did not make it hang up on either of our peers.
            assert {bootstrap_id, ours.host.get_id().to_base58()} <= set(await rust_peers())
    finally:
        await trio.to_thread.run_sync(rust.close)


async def _contains(pending, item):  # type: ignore[no-untyped-def]
    return item in await pending
