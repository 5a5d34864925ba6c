"""The learner's manifest record in the DHT (``JobDirectory``): versions
published faster than ``put_interval_s`` are put at most once an interval,
the newest going out next (real py-libp2p hosts on loopback)."""

import json
import math

import trio
from libp2p.peer.peerinfo import PeerInfo

from echo_learner.swarm.directory import JobDirectory
from protocol import codec, manifest
from protocol.identity import Identity
from protocol.ids import manifest_key, manifest_keys
from protocol.net.records import decode_record
from protocol.net.swarm import Swarm, open_swarm

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
MODEL = {
    "model_type": "llama",
    "vocab_size": 259,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}
VERSIONS = 20
EVERY_S = 0.05  # a version every 50 ms: ten in each put interval
INTERVAL_S = 0.5


def encoded_manifest(learner: Identity, version: int) -> bytes:
    signed, _ = manifest.build(
        learner,
        job_id="reverse-test",
        version=version,
        parent_version=version - 1,
        task="reverse",
        model_config=json.dumps(MODEL),
        tokenizer_digest=bytes(32),
        weights=b"w" * 10,
        chunk_size=4,
    )
    return codec.encode(signed)


def stored_version(peer: Swarm, learner: Identity) -> int | None:
    """The version of the record ``peer`` holds for ``learner``, if any."""
    key = manifest_key(learner.peer_id_str)
    record = peer.dht.value_store.get(key.encode())
    return None if record is None else decode_record(key, record.value).version


async def test_versions_published_faster_than_the_put_interval_are_put_once_an_interval_newest_last():
    learner = Identity.generate()
    async with (
        open_swarm(learner, [LOOPBACK], server=True) as ours,
        open_swarm(Identity.generate(), [LOOPBACK], server=True) as peer,
    ):
        await ours.host.connect(PeerInfo(peer.host.get_id(), peer.host.get_addrs()))
        await ours.dht.add_peer(peer.host.get_id())
        puts: list[bytes] = []
        put_value = ours.dht.put_value

        async def counted(key: str, value: bytes) -> None:
            puts.append(value)
            await put_value(key, value)

        ours.dht.put_value = counted
        directory = JobDirectory(ours, learner.peer_id_str, put_interval_s=INTERVAL_S)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(directory.keep_manifest)
            started = trio.current_time()
            for version in range(1, VERSIONS + 1):
                directory.published(version, encoded_manifest(learner, version))
                await trio.sleep(EVERY_S)  # the learner's pace, not a wait for the directory
            with trio.fail_after(INTERVAL_S + 10):
                while stored_version(peer, learner) != VERSIONS:  # the newest goes out within an interval
                    await trio.sleep(0.05)
            elapsed = trio.current_time() - started
            nursery.cancel_scope.cancel()
    keys = len(manifest_keys(learner.peer_id_str))
    # One put (under each key) at the start and one at the end of each
    # interval at most; put at every version there would be VERSIONS.
    assert len(puts) <= keys * (1 + math.ceil(elapsed / INTERVAL_S)) < keys * VERSIONS
    assert decode_record(manifest_key(learner.peer_id_str), puts[-1]).version == VERSIONS
