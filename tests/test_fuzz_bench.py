"""bench/fuzz.py runs and finds no crash (a short run; the bench runs 100,000 cases)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_short_fuzz_run_finds_no_crash():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fuzz.py"), "--cases", "2000", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["cases"] >= 2000
    assert result["crashes"] == 0, result
    assert result["unbounded_allocations"] == 0, result
    assert all(t["cases"] > 0 for t in result["targets"].values())
