"""``echo-node service install``: a unit systemd accepts, a launchd agent, one-line refusals."""

import plistlib
import shutil
import subprocess
import sys

import pytest

from echo_node import service_unit

BOOTSTRAP = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
ARGS = ["--bootstrap", BOOTSTRAP, "--name", 'my "100%" $HOME laptop']


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "echo_node", "service", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_accepts_the_unit_with_its_caps_and_quoted_arguments(tmp_path):
    limits = service_unit.Limits(cpu_percent=150, memory_gib=6)
    path = service_unit.install("systemd", ARGS, limits, tmp_path, enable=False)
    verify = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stderr
    text = path.read_text()
    assert "CPUQuota=150%" in text and "MemoryMax=6144M" in text and "Nice=10" in text
    # Quoted as one argument, with systemd's specifiers and variables escaped.
    assert '"my \\"100%%\\" $$HOME laptop"' in text


def test_the_launchd_agent_runs_join_at_login_at_low_priority(tmp_path):
    path = service_unit.install("launchd", ARGS, service_unit.Limits(memory_gib=2), tmp_path, enable=False)
    agent = plistlib.loads(path.read_bytes())
    assert agent["ProgramArguments"] == [sys.executable, "-m", "echo_node", "join", *ARGS]
    assert agent["RunAtLoad"] is True and agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["Nice"] == 10 and agent["ProcessType"] == "Background"
    assert agent["SoftResourceLimits"]["ResidentSetSize"] == 2 * 2**30


def test_the_cli_refuses_bad_join_settings_and_writes_nothing(tmp_path):
    bad = cli(
        "install",
        "--platform",
        "systemd",
        "--dir",
        str(tmp_path),
        "--no-enable",
        "--",
        "--bootstrap",
        BOOTSTRAP,
        "--max-upload-mbit",
        "-3",
    )
    assert bad.returncode == 2 and "--max-upload-mbit" in bad.stderr and len(bad.stderr.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
    good = cli("install", "--platform", "systemd", "--dir", str(tmp_path), "--no-enable", "--", *ARGS)
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "echo-node.service").exists()
    assert cli("uninstall", "--platform", "systemd", "--dir", str(tmp_path), "--no-enable").returncode == 0
    assert list(tmp_path.iterdir()) == []
    again = cli("uninstall", "--platform", "systemd", "--dir", str(tmp_path), "--no-enable")
    assert again.returncode != 0 and "no service installed" in again.stderr
