"""A whole swarm as real processes on 127.0.0.1: used by ``make demo`` and the tests.

Every process is started with the same commands a user would type. The
context manager owns them all: on exit each gets SIGINT (a clean leave), then
SIGKILL if it has not gone within a grace period, so nothing outlives it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


class SwarmError(RuntimeError):
    pass


@dataclass
class LocalSwarm:
    root: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    bootstrap_addr: str = ""
    # Optional CPU pinning by process name (benchmarks: give a node its own
    # core, as it would have on a volunteer's machine).
    cpus: dict[str, set[int]] = field(default_factory=dict)
    # Optional command prefix by process name, e.g. ``ip netns exec NS`` to run
    # it on another (namespaced) machine (scripts/netns.py).
    machine: dict[str, list[str]] = field(default_factory=dict)
    listen: str = LOOPBACK

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        if name in self.machine:
            # A namespaced machine (scripts/netns.py) has a LAN of its own:
            # mDNS keeps its default (on).
            env.pop("ECHO_NODE_MDNS", None)
            env.pop("ECHO_LEARNER_MDNS", None)
        elif args[0] != "bootstrap":
            # Here mDNS would announce a local swarm to the real LAN.
            args = [*args, "--no-mdns"]
        log = open(self.root / f"{name}.log", "w")
        cpus = self.cpus.get(name)
        how = [] if args[0].endswith(".py") else ["-m"]  # a script of ours (bench/cheats.py), or a module
        proc = subprocess.Popen(
            [*self.machine.get(name, []), sys.executable, *how, *args],
            stdout=subprocess.PIPE if name == "bootstrap" else log,
            stderr=log,
            env=env,
            start_new_session=True,  # Ctrl-C in the terminal reaches us, not them
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        self.procs[name] = proc
        return proc

    def start_bootstrap(self, timeout_s: float = 60, listen: str = LOOPBACK) -> str:
        proc = self._spawn(
            "bootstrap",
            ["bootstrap", "--listen", listen, "--identity", str(self.root / "bootstrap.key")],
        )
        assert proc.stdout is not None
        # The bootstrap prints its address as its first line.
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("/ip4/"):
            raise SwarmError(f"bootstrap did not print its address: {line!r}; see bootstrap.log")
        self.bootstrap_addr = line
        return line

    def start_learner(self, *extra: str) -> subprocess.Popen:
        return self._spawn(
            "learner",
            [
                "echo_learner",
                "run",
                "--bootstrap",
                self.bootstrap_addr,
                "--listen",
                self.listen,
                "--data-dir",
                str(self.root / "learner"),
                *extra,
            ],
        )

    def start_node(
        self,
        index: int,
        *extra: str,
        invite: str = "",
        program: tuple[str, ...] = ("echo_node",),
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        """A node joined through the bootstrap peer, or with only ``invite``;
        ``program``: what runs ``join`` (a node changed by bench/cheats.py);
        ``env``: variables added to its environment."""
        how = [invite] if invite else ["--bootstrap", self.bootstrap_addr]
        return self._spawn(
            f"node{index}",
            [*program, "join", *how, "--listen", self.listen, "--data-dir", str(self.root / f"node{index}"), *extra],
            env,
        )

    def run(self, name: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        """Run a command (``python -m ARGS``) to completion on ``name``'s machine."""
        return subprocess.run(
            [*self.machine.get(name, []), sys.executable, "-m", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def metrics(self) -> list[dict]:
        path = self.root / "learner" / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll ``predicate`` (files other processes write: there is no event to
        await) until it holds; fails if a process exits or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            for name, proc in self.procs.items():
                assert proc.poll() is None, f"{name} exited: " + (self.root / f"{name}.log").read_text()[-2000:]
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + self.log_tails()
            time.sleep(0.5)

    def log_tails(self, chars: int = 1500) -> str:
        """The end of every process's log, to tell from a failed wait what each was doing."""
        tails = []
        for name in self.procs:
            log = self.root / f"{name}.log"
            tails.append(f"--- {name}.log\n" + (log.read_text(errors="replace")[-chars:] if log.exists() else "(none)"))
        return "\n".join(tails)

    def stop(self, name: str, grace_s: float = 30) -> int:
        """SIGINT, then SIGKILL after ``grace_s``; returns the exit code."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode

    def stop_all(self) -> dict[str, int]:
        # Nodes first so they leave while the bootstrap still answers.
        order = sorted(self.procs, key=lambda n: (n == "bootstrap", n))
        return {name: self.stop(name) for name in order}


@contextmanager
def local_swarm(root: Path) -> Iterator[LocalSwarm]:
    root.mkdir(parents=True, exist_ok=True)
    swarm = LocalSwarm(root)
    try:
        yield swarm
    finally:
        swarm.stop_all()
