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
