"""One network-namespace test module at a time, whichever xdist worker runs it.

``make test`` runs on both cores, and two Topologies of one prefix cannot
coexist: each removes what it finds of its prefix when it starts. The lock is
held for a whole module because some modules share one Topology across their
tests (module fixtures).

xdist's ``--dist loadgroup`` did this until pytest 9.2, whose structured node
IDs silently dropped its groups (pytest-dev/pytest-xdist#1386): CI ran both
LAN tests at once, and each tore down the other's namespaces.
"""

from __future__ import annotations

import pytest

from tests.shared import one_at_a_time


@pytest.fixture(scope="module", autouse=True)
def one_topology_at_a_time(tmp_path_factory):
    with one_at_a_time(tmp_path_factory, "netns"):
        yield
