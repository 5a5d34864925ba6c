"""``echo-node service install``: a volunteer's node that starts at login.

Linux: a systemd user unit (``~/.config/systemd/user/echo-node.service``),
enabled with ``systemctl --user enable --now``. macOS: a launchd agent
(``~/Library/LaunchAgents/net.echoswarm.node.plist``), loaded with
``launchctl``. Both run ``echo-node join`` with the arguments given, at low
priority (nice 10, idle-class I/O), restarted when it fails, and within the
CPU and memory caps asked for, so the machine stays its owner's.
"""

from __future__ import annotations

import plistlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from protocol.process.files import write_atomic

UNIT = "echo-node.service"
LABEL = "net.echoswarm.node"


class ServiceError(RuntimeError):
    """The service could not be installed or removed; the message says why."""


@dataclass(frozen=True)
class Limits:
    cpu_percent: float = 0.0  # of one core, as systemd counts (0: no cap)
    memory_gib: float = 0.0  # 0: no cap
    nice: int = 10


def command(join_args: list[str]) -> list[str]:
    """What the service runs: this Python's ``echo-node join`` (no PATH needed)."""
    return [sys.executable, "-m", "echo_node", "join", *join_args]


def _systemd_word(word: str) -> str:
    """One ExecStart argument as systemd reads it: ``%`` and ``$`` escaped,
    quoted when it holds spaces, quotes or backslashes."""
    word = word.replace("%", "%%").replace("$", "$$")
    if re.search(r'[\s"\'\\]', word):
        word = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return word


def systemd_unit(join_args: list[str], limits: Limits) -> str:
    lines = [
        "[Unit]",
        "Description=Echo Swarm volunteer node (echo-node join)",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "ExecStart=" + " ".join(_systemd_word(w) for w in command(join_args)),
        # A clean stop (SIGINT, as Ctrl-C) lets the node leave the swarm and keep its receipts.
        "KillSignal=SIGINT",
        "TimeoutStopSec=30",
        "Restart=on-failure",
        "RestartSec=30",
        f"Nice={limits.nice}",
        "IOSchedulingClass=idle",
        "CPUWeight=20",  # the owner's programs come first
    ]
    if limits.cpu_percent:
        lines.append(f"CPUQuota={limits.cpu_percent:g}%")
    if limits.memory_gib:
        lines.append(f"MemoryMax={round(limits.memory_gib * 1024)}M")
    lines += ["", "[Install]", "WantedBy=default.target", ""]
    return "\n".join(lines)


def launchd_plist(join_args: list[str], limits: Limits, log_dir: Path) -> bytes:
    agent: dict = {
        "Label": LABEL,
        "ProgramArguments": command(join_args),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},  # restarted when it fails
        "ThrottleInterval": 30,
        "ProcessType": "Background",
        "Nice": limits.nice,
        "LowPriorityIO": True,
        "StandardOutPath": str(log_dir / "echo-node.log"),
        "StandardErrorPath": str(log_dir / "echo-node.log"),
    }
    if limits.memory_gib:
        agent["SoftResourceLimits"] = {"ResidentSetSize": round(limits.memory_gib * 2**30)}
    return plistlib.dumps(agent)


def default_dir(platform: str) -> Path:
    if platform == "launchd":
        return Path.home() / "Library" / "LaunchAgents"
    return Path.home() / ".config" / "systemd" / "user"


def install(platform: str, join_args: list[str], limits: Limits, where: Path, *, enable: bool) -> Path:
    """Write the unit (or agent) into ``where``; with ``enable``, start it now
    and at every login. ``ServiceError`` says what failed (the file stays)."""
    where.mkdir(parents=True, exist_ok=True)
    if platform == "launchd":
        path = where / f"{LABEL}.plist"
        write_atomic(path, launchd_plist(join_args, limits, Path.home() / "Library" / "Logs"))
        # Unloading an agent not loaded yet fails harmlessly.
        steps = [(["launchctl", "unload", str(path)], False), (["launchctl", "load", "-w", str(path)], True)]
    else:
        path = where / UNIT
        write_atomic(path, systemd_unit(join_args, limits))
        steps = [
            (["systemctl", "--user", "daemon-reload"], True),
            (["systemctl", "--user", "enable", "--now", UNIT], True),
        ]
    if enable:
        _run(steps, path)
    return path


def uninstall(platform: str, where: Path, *, enable: bool) -> Path:
    """Stop and remove the unit (or agent); the node's data dir stays."""
    if platform == "launchd":
        path = where / f"{LABEL}.plist"
        steps = [(["launchctl", "unload", "-w", str(path)], False)]
    else:
        path = where / UNIT
        steps = [(["systemctl", "--user", "disable", "--now", UNIT], False)]
    if not path.exists():
        raise ServiceError(f"no service installed at {path}")
    if enable:
        _run(steps, path)  # stopping one that is not running is no error
    path.unlink()
    if enable and platform == "systemd":
        _run([(["systemctl", "--user", "daemon-reload"], True)], path)
    return path


def _run(steps: list[tuple[list[str], bool]], path: Path) -> None:
    """Run each ``(command, required)``; a required one that fails raises."""
    for step, required in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServiceError(f"{path}: could not run {' '.join(step)}: {exc}") from None
        if done.returncode != 0 and required:
            raise ServiceError(
                f"{path} is written, but `{' '.join(step)}` failed: {(done.stderr or done.stdout).strip()}"
            )
