"""A run killed before it cleaned up leaves namespaces with processes inside
(a miniupnpd among them once made a later run's UPnP home unreachable): the
next Topology with the same prefix removes both."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from netns import Topology, missing_tools

why_not = missing_tools()
pytestmark = [
    pytest.mark.skipif(bool(why_not), reason=f"network namespace tests: {why_not}"),
]

KILLED_RUN = textwrap.dedent(
    """
    import os, subprocess, sys
    sys.path.insert(0, sys.argv[1])
    from netns import Topology
    Topology("es-left").__enter__()
    subprocess.run(["ip", "netns", "add", "es-left-home"], check=True)
    # Its first line says it runs inside the namespace (the pid is ip's until it execs).
    daemon = subprocess.Popen(["ip", "netns", "exec", "es-left-home", "sh", "-c", "echo in; exec sleep 600"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    daemon.stdout.readline()
    print(daemon.pid, flush=True)
    os._exit(0)  # killed: nothing cleaned up
    """
)


def test_a_killed_runs_namespaces_and_their_processes_are_removed():
    import netns

    out = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, str(Path(netns.__file__).parent)],
        capture_output=True,
        text=True,
        check=True,
    )
    daemon = int(out.stdout.split()[0])
    assert str(daemon) in subprocess.run(["ip", "netns", "pids", "es-left-home"], capture_output=True, text=True).stdout
    with Topology("es-left"):
        pass
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(daemon)], capture_output=True, text=True).stdout.strip()
    assert state in ("", "Z"), state  # gone, or a zombie of the dead parent
    assert "es-left" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
