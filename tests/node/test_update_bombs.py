"""A node fed update bombs by the learner it trusts (a leaked key, a hostile
operator's invite) refuses each in one log line, keeps the version it runs
and goes on to load the next sane one.

Real parts: two libp2p hosts on 127.0.0.1, the broadcast engine and version
store on disk, the torch backend, and the node's own ``Weights`` following
the learner's versions.
"""

import logging

import numpy as np
import pytest
import trio
import zstandard
from libp2p.peer.peerinfo import PeerInfo
from safetensors.torch import save

from echo_learner.training.lora import LoraSettings, adapter_state, state_bytes, wrap
from echo_learner.training.model import ModelShape, build_model, config_json
from echo_node.backend_torch import TorchBackend
from echo_node.config import NodeConfig
from echo_node.weights import Weights
from protocol import manifest
from protocol.broadcast.engine import BroadcastEngine
from protocol.broadcast.store import VersionStore
from protocol.identity import Identity
from protocol.models import updates
from protocol.net.swarm import open_swarm
from tests.protocol.samples import LEARNER

JOB = "bombs"
TARGETS = ("q_proj", "v_proj")


class Lines(logging.Handler):
    """Wakes the test at each log event of ``echo_node.weights``."""

    def __init__(self):
        super().__init__()
        self.seen: list[logging.LogRecord] = []
        self.changed = trio.Event()

    def emit(self, record):
        self.seen.append(record)
        self.changed.set()

    def of(self, text, version):
        """The events ``text`` about ``version``: the fields they were logged
        with. A refusal names the version the learner wants, which may be
        newer than the one refused: its reason names that one first."""
        found = [getattr(r, "fields", {}) for r in self.seen if r.getMessage() == text]
        return [
            f
            for f in found
            if (str(f["reason"]).startswith(f"v{version}:") if "reason" in f else f.get("version") == version)
        ]

    async def wait_for(self, text, version):
        while not self.of(text, version):
            self.changed = trio.Event()
            await self.changed.wait()


def build(version, model_config, weights, update=None):
    return manifest.build(
        LEARNER,
        job_id=JOB,
        version=version,
        parent_version=version - 1,
        task="reverse",
        model_config=model_config,
        tokenizer_digest=b"t" * 32,
        weights=weights,
        chunk_size=64 * 1024,
        update=update,
    )


@pytest.fixture
def lines():
    handler = Lines()
    logger = logging.getLogger("echo_node.weights")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)


async def test_a_node_refuses_update_bombs_keeps_its_version_and_loads_the_next(tmp_path, lines):
    model = build_model(ModelShape())
    cfg, base_weights = config_json(model), state_bytes(model)
    base, base_chunks = build(0, cfg, base_weights)
    lora = LoraSettings(rank=4, alpha=8.0, dropout=0.0, targets=TARGETS)
    tensors = adapter_state(wrap(build_model(ModelShape()), lora))

    def adapter(alpha):
        return save(tensors, metadata=updates.lora_metadata(lora.rank, alpha))

    def lora_version(version, alpha):
        payload = adapter(alpha)
        return build(version, cfg, b"", manifest.Update(updates.LORA, base, payload))

    # 256 KiB of frame whose header declares 1 EiB: python-zstandard's one-shot
    # decoder would allocate that before reading a block.
    writer = zstandard.ZstdCompressor().compressobj(size=2**60)
    bomb = writer.compress(np.random.default_rng(0).bytes(256 * 1024)) + writer.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    versions = [
        lora_version(1, 1e38),  # alpha/rank 2.5e37: every merged weight overflows
        build(2, cfg, base_weights, manifest.Update(updates.DELTA, base, bomb)),
        lora_version(3, float("nan")),
        lora_version(4, 8.0),  # a sane one
    ]

    config = NodeConfig(data_dir=tmp_path / "node", max_retry_s=0.05, retry_s=0.05)
    async with (
        open_swarm(LEARNER, ["/ip4/127.0.0.1/tcp/0"], server=True) as seed_swarm,
        open_swarm(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"], server=False) as node_swarm,
    ):
        seed = BroadcastEngine(
            seed_swarm,
            VersionStore(tmp_path / "seed", learner_id=LEARNER.peer_id_str, keep=8),
            job_id=JOB,
            learner_id=LEARNER.peer_id_str,
            is_seed=True,
        )
        node = BroadcastEngine(
            node_swarm,
            VersionStore(tmp_path / "node", learner_id=LEARNER.peer_id_str, keep=8),
            job_id=JOB,
            learner_id=LEARNER.peer_id_str,
            is_seed=False,
        )
        weights = Weights(TorchBackend(threads=1), config, free=lambda: 8 * 2**30)
        weights.engine, weights.learner_id = node, LEARNER.peer_id_str
        # A version adopted rather than refused would leave this waiting.
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                await nursery.start(seed.run)
                await nursery.start(node.run)
                nursery.start_soon(node.connect, PeerInfo(seed_swarm.host.get_id(), seed_swarm.host.get_addrs()))
                await seed.publish(base, base_chunks)
                nursery.start_soon(weights.follow)
                weights.named(0)
                await lines.wait_for("loaded weights", 0)
                for (m, chunks), why in zip(
                    versions[:3], ("alpha/rank", "declares 1152921504606846976 bytes", "not a finite number")
                ):
                    await seed.publish(m, chunks)
                    weights.named(m.version)
                    await lines.wait_for("refused a version", m.version)
                    reason = str(lines.of("refused a version", m.version)[0]["reason"])
                    assert reason.startswith(f"v{m.version}:") and why in reason, reason
                    assert weights.version == 0  # still generating from the base
                await seed.publish(*versions[3])
                weights.named(4)
                await lines.wait_for("loaded weights", 4)
                assert weights.version == 4
                nursery.cancel_scope.cancel()
    samples = weights.backend.generate([(257, 1, 2, 3)], 2, 4, 1.0, ())
    assert all(np.isfinite(s.logprobs).all() for group in samples for s in group)
