"""A node protects its volunteer's machine from what its learner asks (real processes)."""

from tests.test_crash import wait_until


def test_a_version_larger_than_the_disk_quota_is_refused_before_anything_is_written(swarm_factory):
    swarm = swarm_factory
    swarm.start_bootstrap()
    swarm.start_learner("--steps", "100000")
    # 1 MiB for 3 versions (2 kept + 1 downloading): ~350 KB each, and the
    # built-in model is ~1.6 MB.
    node = swarm.start_node(0, "--max-disk-gb", "0.001")
    log = swarm.root / "node0.log"
    wait_until(
        lambda: "refused what the learner asked for" in log.read_text(),
        120,
        "the node refusing the job's weights",
        proc=node,
        log=log,
    )
    text = log.read_text()
    assert "more than this process may store per version" in text, text[-2000:]
    assert text.count("refused what the learner asked for") == 1  # one clear line, not one per retry
    assert node.poll() is None, text[-2000:]  # the node stays up
    weights = swarm.root / "node0" / "weights"
    written = [p for p in weights.rglob("*") if p.is_file()] if weights.exists() else []
    assert written == []
    assert swarm.stop("node0") == 0
