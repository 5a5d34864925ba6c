import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "bench"))
# Processes the tests start must not announce themselves on this machine's
# real LAN; the namespaced LAN tests (tests/net/) pass --mdns explicitly.
os.environ["ECHO_NODE_MDNS"] = "false"
os.environ["ECHO_LEARNER_MDNS"] = "false"


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """The built-in model taught the reverse task to near-determinism
    (bench/policies.py, 11 s on 2 cores). Trained once per test run: both
    xdist workers need it, so the first leaves its weights for the other."""
    import torch
    from policies import reverse_trained

    from echo_learner.training.model import build_model
    from tests.shared import shared_between_workers

    with shared_between_workers(tmp_path_factory, "trained-reverse.pt") as (path, exists):
        if exists:
            model = build_model()
            model.load_state_dict(torch.load(path, weights_only=True))
            return model.eval()
        model = reverse_trained()
        torch.save(model.state_dict(), path)
        return model


@pytest.fixture
def swarm_factory(tmp_path):
    """Start real bootstrap/learner/node processes; all are stopped at teardown."""
    from localswarm import local_swarm

    with local_swarm(tmp_path / "swarm") as swarm:
        yield swarm


@pytest.fixture
def broadcast_swarm(tmp_path):
    """A bootstrap peer plus a factory for bench/broadcast_peer.py processes."""
    from localswarm import local_swarm
    from swarmproc import Peer

    peers = []

    class Factory:
        root = tmp_path

        def __init__(self, swarm):
            self.bootstrap = swarm.start_bootstrap()

        def start(self, name, *args):
            peer = Peer(name, ["--bootstrap", self.bootstrap, "--data-dir", str(tmp_path / name), *args], tmp_path)
            peers.append(peer)
            return peer

    with local_swarm(tmp_path / "swarm") as swarm:
        try:
            yield Factory(swarm)
        finally:
            for peer in peers:
                peer.stop()
