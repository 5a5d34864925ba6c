"""What a bench's window cost: each process's CPU, where the machine's CPU
time went, and the learner's own view (its status API read each second)."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_times() -> list[int]:
    """The machine's CPU time so far, in ticks: user, nice, system, idle, iowait, irq, softirq, steal."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def machine_shares(before: list[int], after: list[int]) -> dict:
    """Where the machine's CPU time went between two ``machine_times``: busy,
    waiting on the disk, and taken by the host (steal), as shares of the whole."""
    d = [a - b for a, b in zip(after, before)]
    total = sum(d) or 1
    return {
        "busy": round((d[0] + d[1] + d[2] + d[5] + d[6]) / total, 3),
        "iowait": round(d[4] / total, 3),
        "steal": round(d[7] / total, 3),
    }


def json_reports(log: Path) -> list[dict]:
    """The JSON lines a bench helper process printed to ``log`` (its other
    lines are logging), oldest first."""
    if not log.exists():
        return []
    return [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]


# What a batch costs the learner besides the model's work: every phase of its
# ``load`` split (echo_learner/verify/cpu_split.py) but these.
NOT_CONTROL = ("recompute", "train")


def load_split(before: dict, after: dict) -> dict:
    """The learner's CPU ms per accepted batch by phase over the window, from
    its cumulative ``load`` at the window's two ends."""
    batches = after["accepted_batches"] - before["accepted_batches"]

    def spent_ms(load: dict, phase: str) -> float:
        return load["cpu_ms_per_batch"][phase] * max(load["accepted_batches"], 1)

    return {
        "accepted_batches": batches,
        "cpu_ms_per_batch": {
            phase: round((spent_ms(after, phase) - spent_ms(before, phase)) / max(batches, 1), 3)
            for phase in after["cpu_ms_per_batch"]
        },
    }


def control_ms(split: dict) -> float:
    """The learner's control-plane CPU ms per batch in a ``load_split``."""
    return round(sum(ms for phase, ms in split["cpu_ms_per_batch"].items() if phase not in NOT_CONTROL), 3)


class _InThread:
    """A sampler that runs ``_run`` in a daemon thread for the ``with`` block
    (``_run`` returns once ``self.stop`` is set)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


class StatusSampler(_InThread):
    """The learner's ``/api/status`` read once a second in a thread during the
    window: how late its event loop ran (past ``--busy-lag-ms`` new work
    requests hear 'busy') and how many steps it made."""

    def __init__(self, api_port: int):
        self.url = f"http://127.0.0.1:{api_port}/api/status"
        self.lags: list[float] = []
        self.first: dict | None = None
        self.last: dict | None = None
        super().__init__()

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as reply:
                    status = json.loads(reply.read())
            except (OSError, ValueError):
                continue
            self.first = self.first or status
            self.last = status
            self.lags.append(status["load"]["loop_lag_ms"])

    def summary(self) -> dict:
        if not self.lags or self.first is None or self.last is None:
            return {}
        return {
            "loop_lag_ms_mean": round(sum(self.lags) / len(self.lags), 1),
            "loop_lag_ms_max": max(self.lags),
            "steps": self.last["step"] - self.first["step"],
            "versions": self.last["version"] - self.first["version"],
            "batches_refused": self.last["batches_refused"] - self.first["batches_refused"],
            # Its CPU per accepted batch by phase over the window: the
            # model's work (recompute, train) apart from the control plane's.
            "cpu_ms_per_batch": load_split(self.first["load"], self.last["load"])["cpu_ms_per_batch"],
        }


def _fixed_work() -> int:
    """A fixed piece of interpreter work (1.6-2.3 ms of CPU here): what the
    probe times. Pure Python, as most of a swarm's control plane is."""
    total = 0
    for i in range(20_000):
        total += i * i % 7
    return total


class SpeedProbe(_InThread):
    """How fast this machine ran during a window: a fixed piece of work
    (``_fixed_work``) timed in CPU time, on each of ``cpus`` in turn, every
    ``every_s``, in a thread of the bench's own process.

    Why: a virtual machine's cores run as fast as the host lets them. Here
    a fixed loop's CPU time in the slowest 10-s block of two idle minutes
    was 1.39 times the fastest's (cv 0.186 per sample), on both cores at once
    (correlation 0.65), and a busy neighbouring core changed it by 2 %
    (2026-12-01): the host's other tenants, not our processes. A swarm whose
    work is CPU-bound runs slower by as much, so a rate measured in one
    window is judged against another's carried to the same speed
    (``slowness``). It takes ~0.6 % of each core.
    """

    def __init__(self, cpus: set[int], every_s: float = 0.5):
        self.cpus = sorted(cpus)
        self.every_s = every_s
        self.samples: list[tuple[float, int, float]] = []  # (wall-clock time, cpu, CPU seconds of the work)
        super().__init__()

    def _run(self) -> None:
        while not self.stop.is_set():
            for cpu in self.cpus:
                os.sched_setaffinity(0, {cpu})  # 0: this thread alone, on Linux
                started = time.thread_time()
                _fixed_work()
                self.samples.append((time.time(), cpu, time.thread_time() - started))
            self.stop.wait(self.every_s)

    def slowness(self, cpu: int | None = None) -> float | None:
        """The work's mean CPU ms over the window (on ``cpu``, or on every
        core): larger when the machine ran slower."""
        times = [s for _, c, s in self.samples if cpu is None or c == cpu]
        return round(1000 * sum(times) / len(times), 3) if times else None

    def summary(self) -> dict:
        return {
            "samples": len(self.samples),
            "slowness_ms": self.slowness(),
            "slowness_ms_by_cpu": {str(c): self.slowness(c) for c in self.cpus},
        }
