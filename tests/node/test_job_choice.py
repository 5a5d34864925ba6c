"""Which job a node without an invite takes from the DHT's job directory:
the one job that checks out, never a decoy, and none when several do (the
volunteer chooses). Real py-libp2p hosts on loopback, in one process."""

import json
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
from libp2p.peer.peerinfo import PeerInfo

from echo_node.config import NodeConfig
from echo_node.learner_lookup import NoLearnerFound, SeveralJobs, find_learner
from protocol import codec, manifest
from protocol.identity import Identity
from protocol.ids import JOB_DIRECTORY_KEY, manifest_keys
from protocol.net.host import full_addrs
from protocol.net.swarm import Swarm, announce, open_swarm

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
MODEL = json.dumps(
    {
        "model_type": "llama",
        "vocab_size": 259,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    }
)
JUNK = '{"model_type": "llama"}'  # signed, but sizes missing


async def join(swarm: Swarm, hub: Swarm) -> None:
    await swarm.host.connect(PeerInfo(hub.host.get_id(), hub.host.get_addrs()))
    await swarm.dht.add_peer(hub.host.get_id())


@asynccontextmanager
async def learner(hub: Swarm, job_id: str, model_config: str):
    """A peer that announces ``job_id`` with a signed manifest of ``model_config``."""
    identity = Identity.generate()
    record, _ = manifest.build(
        identity,
        job_id=job_id,
        version=0,
        parent_version=-1,
        task="reverse",
        model_config=model_config,
        tokenizer_digest=bytes(32),
        weights=b"w" * 10,
        chunk_size=4,
    )
    async with open_swarm(identity, [LOOPBACK], server=True) as swarm:
        await join(swarm, hub)
        assert await announce(swarm, JOB_DIRECTORY_KEY, 10) == 1
        for key in manifest_keys(identity.peer_id_str):
            await swarm.dht.put_value(key, codec.encode(record))
        yield identity.peer_id_str


@asynccontextmanager
async def directory(*jobs: tuple[str, str]):
    """A hub DHT host, one learner per ``(job id, model config)``, and a node's swarm."""
    async with AsyncExitStack() as stack:
        hub = await stack.enter_async_context(open_swarm(Identity.generate(), [LOOPBACK], server=True))
        node = await stack.enter_async_context(open_swarm(Identity.generate(), [LOOPBACK], server=True))
        learners = [await stack.enter_async_context(learner(hub, job, model)) for job, model in jobs]
        await join(node, hub)
        yield node, [full_addrs(hub.host)[0]], learners


def config(bootstrap: list[str], **settings) -> NodeConfig:
    return NodeConfig(**{"bootstrap": bootstrap, "discovery_timeout_s": 5, "retry_s": 0.1, "mdns": False, **settings})


async def test_a_decoy_is_skipped_and_the_one_valid_job_taken():
    async with directory(("decoy", JUNK), ("real", MODEL)) as (node, bootstrap, (_, real)):
        found = await find_learner(node, config(bootstrap))
    assert found.peer.to_base58() == real and found.record.job_id == "real"


async def test_with_only_a_decoy_listed_the_node_keeps_looking_then_says_why():
    async with directory(("decoy", JUNK)) as (node, bootstrap, _):
        with pytest.raises(NoLearnerFound, match="skipped 1 that failed their checks"):
            await find_learner(node, config(bootstrap, discovery_timeout_s=2))


async def test_several_valid_jobs_ask_the_volunteer_to_choose_and_job_id_chooses():
    async with directory(("a", MODEL), ("b", MODEL), ("decoy", JUNK)) as (node, bootstrap, (a, b, _)):
        with pytest.raises(SeveralJobs) as several:
            await find_learner(node, config(bootstrap))
        assert f"--job-id a --learner {a}" in str(several.value) and f"--learner {b}" in str(several.value)
        assert "decoy" not in str(several.value)
        found = await find_learner(node, config(bootstrap, job_id="b"))
        assert found.peer.to_base58() == b
