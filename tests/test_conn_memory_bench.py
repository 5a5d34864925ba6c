"""bench/conn_memory.py reads a real py-libp2p server's memory as peers connect."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "conn_memory.py"


def test_python_memory_grows_with_each_connected_peer():
    done = subprocess.run(
        [sys.executable, str(BENCH), "--levels", "2,12", "--trace", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert set(result["levels"]) == {"2", "12"}
    # Each connection holds a Noise session, yamux state and trio tasks: kilobytes, not nothing.
    assert result["traced_kib_per_connection"] > 5, result
    assert result["grown_most_kib"] and all(kib >= 0 for _, kib in result["grown_most_kib"][:3]), result


def test_one_level_is_refused():
    done = subprocess.run([sys.executable, str(BENCH), "--levels", "10"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "two levels" in done.stderr
