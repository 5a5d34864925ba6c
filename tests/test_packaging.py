"""The wheel a user installs: built with ``python -m build``, installed with
its ``llama`` extra into a fresh virtual environment, its three commands run."""

import subprocess
import sys
import venv

import pytest
import torch

from tests.conftest import ROOT


def run(*args: object, timeout: float = 600) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}: {done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_wheel_installs_into_a_fresh_venv_and_its_commands_run(tmp_path):
    # The sdist first, then the wheel from it (as PyPI users get it; no stale build/ in the tree).
    run(sys.executable, "-m", "build", "--outdir", tmp_path / "dist", ROOT)
    (wheel,) = (tmp_path / "dist").glob("echo_swarm-*.whl")
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    pip = [env / "bin" / "python", "-m", "pip", "install", "-q"]
    # The torch this suite runs on (an unpinned one would pull CUDA's packages).
    run(*pip, f"torch=={torch.__version__.split('+')[0]}")
    run(*pip, f"{wheel}[llama]")
    for command in ("echo-node", "echo-learner", "echo-bootstrap"):
        assert run(env / "bin" / command, "--help").startswith(f"usage: {command}")
    assert "--train-procs" in run(env / "bin" / "echo-learner", "run", "--help")
    # The status page's files travel in the wheel, and the installed code serves them.
    check = "from importlib import resources; print((resources.files('echo_learner.operator') / 'static' / 'app.js').is_file())"
    assert run(env / "bin" / "python", "-c", check).strip() == "True"
    assert "gguf" in run(env / "bin" / "python", "-m", "pip", "list").lower()  # the llama extra came along
