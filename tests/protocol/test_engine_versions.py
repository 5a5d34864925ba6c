"""Which version a node's broadcast engine follows when newer ones keep coming."""

import pytest

from protocol import manifest
from protocol.broadcast import bitfield
from protocol.broadcast.engine import BroadcastEngine
from protocol.broadcast.store import VersionStore
from protocol.identity import Identity
from protocol.manifest import manifest_digest
from protocol.net.swarm import open_swarm
from protocol.wire.have import Have
from tests.protocol.samples import LEARNER

CHUNK = 1024


def version(v):
    return manifest.build(
        LEARNER,
        job_id="reverse-test",
        version=v,
        parent_version=v - 1,
        task="reverse",
        model_config="{}",
        tokenizer_digest=b"t" * 32,
        weights=bytes([v]) * (4 * CHUNK),
        chunk_size=CHUNK,
    )


def hold(store, m, chunks, n):
    for idx in range(n):
        store.save_chunk(m, idx, chunks[idx])
        store.mark_held(m.version, idx)


@pytest.mark.parametrize("held, follows", [(0, 2), (1, 2), (2, 1), (3, 1)])
async def test_a_download_half_done_is_finished_before_a_newer_version(tmp_path, held, follows):
    async with open_swarm(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"], server=True) as swarm:
        store = VersionStore(tmp_path, learner_id=LEARNER.peer_id_str, keep=3)
        engine = BroadcastEngine(swarm, store, job_id="reverse-test", learner_id=LEARNER.peer_id_str, is_seed=False)
        m1, chunks1 = version(1)
        engine.want(m1)
        hold(store, m1, chunks1, held)
        m2, _ = version(2)
        engine.want(m2)
        assert engine.target.version == follows
        assert engine.newest_wanted().version == 2  # the newest is never forgotten
        m3, _ = version(3)
        engine.want(m3)
        assert engine.newest_wanted().version == 3
        assert engine.newest_complete() == -1


async def test_a_download_the_learner_moved_past_can_still_be_finished_from_it(tmp_path):
    """The learner restarted mid-broadcast: a chunk of v1 was only its own,
    and it now announces v2. A node that holds half of v1 finishes v1 first,
    so the learner must count as holding all of v1 (it keeps its versions);
    another peer announcing v2 holds nothing of v1."""
    async with open_swarm(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"], server=True) as swarm:
        store = VersionStore(tmp_path, learner_id=LEARNER.peer_id_str, keep=3)
        engine = BroadcastEngine(swarm, store, job_id="reverse-test", learner_id=LEARNER.peer_id_str, is_seed=False)
        m1, chunks1 = version(1)
        engine.want(m1)
        hold(store, m1, chunks1, 2)
        m2, _ = version(2)
        engine.want(m2)
        assert engine.target.version == 1  # half done: finished first
        v2 = Have("reverse-test", 2, manifest_digest(m2), bitfield.encode(range(4), 4))
        engine.downloads.apply_have(LEARNER.peer_id_str, v2)
        engine.downloads.apply_have("another peer", v2)
        peers = engine.state.download.peers
        assert peers[LEARNER.peer_id_str].chunks == frozenset(range(4))
        assert not peers.get("another peer") or not peers["another peer"].chunks
