"""The simulator (bench/broadcast_sim.py) drives the real scheduler; here it is
checked against a real run and for churn."""

from argparse import Namespace

from broadcast import run_once
from broadcast_sim import DEFAULT_MIX, parse_args, simulate
from localswarm import local_swarm

# Settings under which this 2-core machine is not CPU-bound, so that the real
# run measures the network and the scheduler, as the simulator does.
SETTINGS = dict(nodes=4, size_mib=8, upload_mbit=16, chunk_kib=1024)


def test_simulator_agrees_with_a_real_four_node_run(tmp_path):
    with local_swarm(tmp_path) as swarm:
        real = run_once(tmp_path, swarm.start_bootstrap(), Namespace(**SETTINGS, timeout_s=120), relay=True)
    sim = simulate(
        parse_args(
            [
                "--only",
                "--nodes",
                "4",
                "--size-mib",
                "8",
                "--upload-mbit",
                "16",
                "--chunk-kib",
                "1024",
                "--latency-ms",
                "2",
            ]
        )
    )
    assert sim["incomplete"] == 0
    assert abs(real["s"] - sim["p100_s"]) / real["s"] <= 0.30, (real, sim)


def test_every_surviving_node_completes_under_churn():
    result = simulate(
        parse_args(
            [
                "--only",
                "--nodes",
                "200",
                "--size-mib",
                "16",
                "--churn",
                "0.1",
                "--seed",
                "3",
                "--mix",
                DEFAULT_MIX,
                "--relay-only",
                "0.3",
            ]
        )
    )
    assert result["survivors"] == 200  # 20 left, 20 joined
    assert result["incomplete"] == 0


def test_heterogeneous_links_and_relay_only_nodes_complete_above_the_kumar_ross_bound():
    result = simulate(
        parse_args(
            [
                "--only",
                "--nodes",
                "200",
                "--size-mib",
                "16",
                "--mix",
                DEFAULT_MIX,
                "--relay-only",
                "0.3",
            ]
        )
    )
    assert result["incomplete"] == 0
    assert result["p100_s"] >= result["kumar_ross_s"] >= result["bound_s"]


def test_the_kumar_ross_bound_is_the_slowest_of_its_three_terms():
    # 10 nodes uploading 1 Mbit/s: their total (10 + the seed's 20) is what binds.
    result = simulate(
        parse_args(
            [
                "--only",
                "--nodes",
                "10",
                "--size-mib",
                "1",
                "--upload-mbit",
                "20",
                "--mix",
                "1:1:100",
            ]
        )
    )
    assert result["bound_s"] == round(2**20 * 8 / 20e6, 3)
    assert result["kumar_ross_s"] == round(10 * 2**20 * 8 / 30e6, 3)
    slow_download = simulate(
        parse_args(
            [
                "--only",
                "--nodes",
                "10",
                "--size-mib",
                "1",
                "--upload-mbit",
                "20",
                "--mix",
                "1:20:4",
            ]
        )
    )
    assert slow_download["kumar_ross_s"] == round(2**20 * 8 / 4e6, 3)  # M / d_min


def test_bad_mix_is_refused(capsys):
    for bad in ("0.5:20:100", "1:20", "1:-5:100"):
        try:
            parse_args(["--mix", bad])
        except SystemExit:
            assert "--mix" in capsys.readouterr().err
        else:
            raise AssertionError(f"{bad!r} accepted")
