"""bench/swarm_load.py with the learner on the device and cores asked
(``--learner-device``, ``--learner-cpus``): on a GPU machine the learner
trains and verifies on its GPU with a few cores, the emulators on the rest.
Here end to end with ``--learner-device cpu``: one small level of real
processes (issue 72)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "swarm_load.py"


@pytest.mark.slow  # a swarm of real processes for about a minute
def test_the_learner_runs_on_the_device_and_cores_asked(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH), "--levels", "10", "--settle-s", "5", "--duration-s", "20"]
        + ["--learner-device", "cpu", "--learner-cpus", "1", "--dir", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    [level] = result["levels"]
    first = min(os.sched_getaffinity(0))
    assert result["job"]["device"] == "cpu" and result["cpus"]["learner"] == [first]
    assert level["accepted_batches_per_s"] > 0 and level["lost_accepted"] == 0, level
    assert level["status_api_failures"] == 0 and level["status_api_p99_ms"] < 500, level


def test_the_learner_is_started_on_the_device_asked():
    sys.path.insert(0, str(BENCH.parent))
    from swarm_load import Job

    args = Job(device="cuda").learner_args(1000)
    assert args[args.index("--device") + 1] == "cuda"


def test_the_learner_and_the_emulators_each_need_a_cpu():
    cpus = len(os.sched_getaffinity(0))
    done = subprocess.run(
        [sys.executable, str(BENCH), "--levels", "10", "--learner-cpus", str(cpus)], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--learner-cpus" in done.stderr
