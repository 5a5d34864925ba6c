"""bench/objective.py trains the learner's objective in one process and reports what a stall is made of."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_each_report_line_covers_every_group_of_its_steps():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "objective.py"), "--mode", "async", "--steps", "4", "--every", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["step"] for line in lines] == [2, 4]
    for line in lines:
        assert 0.0 <= line["reward"] <= 1.0
        assert abs(line["varied"] + line["flat_below"] + line["flat_best"] - 1.0) < 0.02


def test_bad_arguments_are_refused_before_any_training():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "objective.py"), "--steps", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "at least 1" in done.stderr and not done.stdout
