"""Keep a bench's attacker process off the honest swarm's CPU.

A real attacker burns its own machine's CPU, not ours. On a 2-core machine
that also runs the whole honest swarm, the attacker process runs under
SCHED_IDLE and, where it can be set up, inside a cgroup capped at a share
of a core (``cpu_cap``), so that what a bench measures is what the attack
makes our processes do.
"""

from __future__ import annotations

import os
from pathlib import Path


def idle_priority() -> None:
    """Run the attacker only on CPU time nobody else wants (SCHED_IDLE): on a
    real swarm it burns its own machine, and on this 2-core one even a nice-19
    process slows torch's threads by sharing their cores."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


def cpu_cap(cores: float) -> Path | None:
    """A cgroup whose processes get at most ``cores`` of CPU (v1 cfs quota or
    v2 cpu.max; needs root). None where neither can be set up.

    Why: SCHED_IDLE is not enough on this 2-core VM. Eight peers that only join
    the swarm and ask for nothing (the idle_members control) cost the honest
    nodes ~19 % of their accepted batches uncapped, ~6 % (noise) capped at
    0.04 core: the attacker's own CPU, which a real attacker spends on its
    own machine, not anything it makes our processes do.
    """
    period = 100_000
    quota = max(1000, int(cores * period))
    try:
        if (CGROUP_V1 / "cpu.cfs_quota_us").exists():
            group = CGROUP_V1 / f"echo-attacker-{quota}"
            group.mkdir(exist_ok=True)
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        elif "cpu" in (CGROUP_V2 / "cgroup.controllers").read_text().split():
            (CGROUP_V2 / "cgroup.subtree_control").write_text("+cpu")
            group = CGROUP_V2 / f"echo-attacker-{quota}"
            group.mkdir(exist_ok=True)
            (group / "cpu.max").write_text(f"{quota} {period}")
        else:
            return None
    except OSError:
        return None
    return group


def confine(pid: int, group: Path | None) -> None:
    """Move the running process ``pid`` (all its threads) into ``group``."""
    if group is not None:
        (group / "cgroup.procs").write_text(str(pid))


def attacker_limits(group: Path | None, cpus: set[int] | None = None):
    """preexec_fn for the attacker: into ``group`` (if any), onto ``cpus``
    (if given), then SCHED_IDLE."""

    def apply() -> None:
        confine(0, group)  # pid 0: this process
        if cpus:
            os.sched_setaffinity(0, cpus)
        idle_priority()

    return apply
