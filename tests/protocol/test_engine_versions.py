"""Which version a node's broadcast engine follows when newer ones keep coming."""

import pytest

from protocol import manifest
from protocol.broadcast.engine import BroadcastEngine
from protocol.broadcast.store import VersionStore
from protocol.identity import Identity
from protocol.net.swarm import open_swarm
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
