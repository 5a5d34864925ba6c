import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


@pytest.fixture
def swarm_factory(tmp_path):
    """Start real bootstrap/learner/node processes; all are stopped at teardown."""
    from localswarm import local_swarm

    with local_swarm(tmp_path / "swarm") as swarm:
        yield swarm
