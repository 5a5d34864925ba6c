"""What a rust-libp2p or go-libp2p peer does to store a learner's manifest
record (a FIND_NODE on the record key, then PUT_VALUE) or to join a job's
swarm (a FIND_NODE on the provider key, then ADD_PROVIDER), sent raw over
the Kademlia protocol to one of our DHT hosts, is answered, and our own
lookups then find what it stored (real py-libp2p hosts on loopback)."""

import json

import trio
from libp2p.kad_dht.common import PROTOCOL_ID
from libp2p.kad_dht.pb.kademlia_pb2 import Message, Record
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.peerinfo import PeerInfo
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes

from echo_node.jobs import Job, read_job
from protocol import codec, manifest
from protocol.identity import Identity
from protocol.ids import MAX_FIND_NODE_KEY, legacy_manifest_key, legacy_swarm_key, manifest_key, swarm_key
from protocol.net.host import make_host, parse_multiaddr
from protocol.net.swarm import find_providers, open_swarm

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
MODEL = {
    "model_type": "llama",
    "vocab_size": 259,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


def signed_record(learner: Identity) -> bytes:
    record, _ = manifest.build(
        learner,
        job_id="reverse-test",
        version=3,
        parent_version=2,
        task="reverse",
        model_config=json.dumps(MODEL),
        tokenizer_digest=bytes(32),
        weights=b"w" * 10,
        chunk_size=4,
    )
    return codec.encode(record)


async def ask(client, server, message: Message) -> Message | None:
    """One request on its own stream, as rust-libp2p sends them; None when
    the server resets the stream instead of answering."""
    stream = await client.new_stream(server.host.get_id(), [PROTOCOL_ID])
    try:
        await stream.write(encode_varint_prefixed(message.SerializeToString()))
        with trio.fail_after(10):
            reply = Message()
            reply.ParseFromString(await read_varint_prefixed_bytes(stream))
        return reply
    except StreamError:
        return None
    finally:
        await stream.close()


def test_manifest_keys_fit_what_every_kademlia_accepts_in_find_node():
    learner = Identity.generate().peer_id_str
    assert len(manifest_key(learner).encode()) <= MAX_FIND_NODE_KEY
    assert manifest_key(learner) != manifest_key(Identity.generate().peer_id_str)


async def store_as_rust_libp2p_does(key_of) -> tuple[bool, bool, Job]:
    """A foreign peer stores a learner's record under ``key_of(learner)`` on one
    of our DHT hosts: whether its FIND_NODE and PUT_VALUE were answered, and
    what our node's lookup then reads."""
    learner = Identity.generate()
    key = key_of(learner.peer_id_str).encode()
    value = signed_record(learner)
    async with (
        open_swarm(Identity.generate(), [LOOPBACK], server=True) as ours,
        open_swarm(Identity.generate(), [LOOPBACK], server=True) as node,
    ):
        client = make_host(Identity.generate(), [LOOPBACK])
        async with client.run([parse_multiaddr(LOOPBACK)]):
            await client.connect(PeerInfo(ours.host.get_id(), ours.host.get_addrs()))
            found = await ask(client, ours, Message(type=Message.MessageType.FIND_NODE, key=key))
            put = Message(type=Message.MessageType.PUT_VALUE, key=key, record=Record(key=key, value=value))
            stored = await ask(client, ours, put)
        # Our node reads it through its own lookup, from the host the foreign peer filled.
        await node.host.connect(PeerInfo(ours.host.get_id(), ours.host.get_addrs()))
        await node.dht.add_peer(ours.host.get_id())
        job = await read_job(node, PeerInfo(learner.peer_id, []), 10)
    return found is not None, stored is not None and stored.record.value == value, job


async def test_a_foreign_peer_stores_a_manifest_record_the_way_rust_libp2p_does():
    find_answered, put_answered, job = await store_as_rust_libp2p_does(manifest_key)
    assert find_answered, "FIND_NODE on the record key was reset"
    assert put_answered, "PUT_VALUE was refused"
    assert job.ok and job.record is not None and job.record.version == 3, job.problem


async def test_the_legacy_key_is_one_foreign_peers_cannot_store_through_find_node():
    """Why the key changed: py-libp2p resets a FIND_NODE on the 64-byte legacy
    key, so a rust or go peer never reaches its PUT_VALUE."""
    find_answered, _, _ = await store_as_rust_libp2p_does(legacy_manifest_key)
    assert not find_answered


async def provide_as_rust_libp2p_does(key: str) -> tuple[bool, bool, bool]:
    """A foreign peer announces itself under ``key`` on one of our DHT hosts
    (``start_providing``): whether its FIND_NODE and ADD_PROVIDER were
    answered, and whether our node's ``find_providers`` then finds it."""
    async with (
        open_swarm(Identity.generate(), [LOOPBACK], server=True) as ours,
        open_swarm(Identity.generate(), [LOOPBACK], server=True) as node,
    ):
        client = make_host(Identity.generate(), [LOOPBACK])
        async with client.run([parse_multiaddr(LOOPBACK)]):
            await client.connect(PeerInfo(ours.host.get_id(), ours.host.get_addrs()))
            found = await ask(client, ours, Message(type=Message.MessageType.FIND_NODE, key=key.encode()))
            provided = None
            if found is not None:  # rust-libp2p stops here when its FIND_NODE fails
                me = Message.Peer(id=client.get_id().to_bytes(), addrs=[a.to_bytes() for a in client.get_addrs()])
                add = Message(type=Message.MessageType.ADD_PROVIDER, key=key.encode(), providerPeers=[me])
                provided = await ask(client, ours, add)
            await node.host.connect(PeerInfo(ours.host.get_id(), ours.host.get_addrs()))
            await node.dht.add_peer(ours.host.get_id())
            providers = await find_providers(node, key, 10)
            listed = client.get_id().to_base58() in providers
    return found is not None, provided is not None, listed


async def test_a_foreign_peer_joins_a_job_swarm_the_way_rust_libp2p_does():
    find_answered, add_answered, listed = await provide_as_rust_libp2p_does(swarm_key("reverse-test"))
    assert find_answered, "FIND_NODE on the provider key was reset"
    assert add_answered, "ADD_PROVIDER was not answered"
    assert listed, "our lookup did not find the foreign provider"


async def test_the_legacy_provider_key_is_one_foreign_peers_cannot_announce_under():
    """Why it changed: 53 bytes, so the FIND_NODE that comes first is reset."""
    find_answered, _, listed = await provide_as_rust_libp2p_does(legacy_swarm_key("reverse-test"))
    assert not find_answered and not listed
