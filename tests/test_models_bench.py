"""bench/models.py checks every family's rollouts from both backends as the learner does."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from echo_node.backend_choice import llama_installed

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]' (make test does)")
def test_a_short_run_checks_each_family_and_backend_with_no_false_reject():
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "models.py"),
            "--only",
            "families",
            "--rollouts",
            "32",
            "--families",
            "qwen2,gemma2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    for family in ("qwen2", "gemma2"):
        assert set(result["family_rollouts_checked"][family]) == {"llama_f32", "llama_q8_0", "torch_f32"}
        assert all(n >= 32 for n in result["family_rollouts_checked"][family].values())
        assert all(n == 0 for n in result["family_false_rejects"][family].values())
    assert result["families_ok"] == ["gemma2", "qwen2"]
