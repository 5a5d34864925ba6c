"""Processes of bench/broadcast_peer.py, talked to through JSON lines."""

from __future__ import annotations

import json
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PEER = Path(__file__).resolve().parent / "broadcast_peer.py"


class Peer:
    def __init__(self, name: str, args: list[str], log_dir: Path, machine: list[str] = ()):
        """``machine``: a command prefix that runs it elsewhere (``ip netns exec NS``)."""
        self.name = name
        self.log = open(log_dir / f"{name}.log", "w")
        self.proc = subprocess.Popen(
            [*machine, sys.executable, str(PEER), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            start_new_session=True,
        )
        self.events: list[dict] = []
        self._buf = b""

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def feed(self, data: bytes) -> list[dict]:
        self._buf += data
        out = []
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            if line.strip():
                out.append(json.loads(line))
        self.events += out
        return out

    def last(self, kind: str) -> dict | None:
        return next((e for e in reversed(self.events) if e["event"] == kind), None)

    def stop(self, grace_s: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.log):
            if f is not None:
                f.close()
        return self.proc.returncode

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def wait_until(peers: list[Peer], done, timeout_s: float) -> None:
    """Read events from ``peers`` until ``done()`` is true; TimeoutError otherwise."""
    sel = selectors.DefaultSelector()
    for p in peers:
        assert p.proc.stdout is not None
        sel.register(p.proc.stdout, selectors.EVENT_READ, p)
    deadline = time.monotonic() + timeout_s
    try:
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("peers did not reach the expected state in time")
            for key, _ in sel.select(min(left, 1.0)):
                data = key.fileobj.read1(65536)
                if not data:
                    sel.unregister(key.fileobj)
                    if key.data.proc.poll() is None:
                        continue
                    raise RuntimeError(f"{key.data.name} exited; see its log")
                key.data.feed(data)
    finally:
        sel.close()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a process that must keep its address across restarts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keep_logs(root: Path, dest: Path | None) -> None:
    """Copy the processes' logs out of ``root`` (a benchmark's temporary dir) to ``dest``."""
    if dest is None:
        return
    dest.mkdir(parents=True, exist_ok=True)
    for log in root.glob("*.log"):
        shutil.copy(log, dest / log.name)
