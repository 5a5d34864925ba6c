"""Versions published as updates (deltas against a base) between real processes:
a node without the base fetches it first, partly from peers that follow an
update against it; a peer serving a tampered update chunk is struck."""

from swarmproc import wait_until

from tests.test_broadcast import SLOW_SEED, complete, start_node, start_seed

# Each version after v0 a delta changing a fifth of v0's bytes: about a
# third of its size, in 64 KiB chunks so that peers share the work.
UPDATES = ("--size-mib", "4", "--update-fraction", "0.2", "--chunk-kib", "64", *SLOW_SEED)


def completed(peer):
    return {e["version"]: e for e in peer.events if e["event"] == "complete"}


def test_node_without_the_base_fetches_it_then_the_update(broadcast_swarm):
    seed, seed_id = start_seed(broadcast_swarm, *UPDATES)
    early, early_id = start_node(broadcast_swarm, "early", seed_id)
    wait_until([seed, early], lambda: (early.last("neighbours") or {}).get("n") == 1, 60)
    for version in (0, 1):
        seed.send("publish")
        wait_until([seed, early], lambda: complete(early, version), 60)
    assert seed.last("published")["chunks"] < 0.5 * 64  # the update, not 4 MiB of chunks

    late, _ = start_node(broadcast_swarm, "late", seed_id)
    wait_until([seed, early, late], lambda: complete(late, 1), 90)
    got = completed(late)
    assert (got[0]["format"], got[1]["format"]) == ("safetensors", "delta")
    assert got[0]["exact"] and got[1]["exact"]  # rebuilt bit for bit as signed
    # The base came partly from a peer that announces only the update.
    assert got[0]["bytes_from"].get(early_id, 0) > 0, got[0]["bytes_from"]


def test_tampered_update_chunk_is_caught_and_its_sender_struck(broadcast_swarm):
    seed, seed_id = start_seed(broadcast_swarm, *UPDATES)
    evil, evil_id = start_node(broadcast_swarm, "evil", seed_id, "--corrupt")
    honest, _ = start_node(broadcast_swarm, "honest", seed_id)
    wait_until([seed, evil, honest], lambda: (honest.last("neighbours") or {}).get("n") == 2, 60)
    seed.send("publish")
    wait_until([seed, evil, honest], lambda: complete(evil) and complete(honest), 60)
    honest.stop()
    seed.send("publish")  # v1, an update against v0, which the honest node holds
    wait_until([seed, evil], lambda: complete(evil, 1), 60)

    again, _ = start_node(broadcast_swarm, "honest-again", seed_id, "--data-dir", str(broadcast_swarm.root / "honest"))
    wait_until([seed, evil, again], lambda: complete(again, 1), 90)
    done = completed(again)[1]
    assert done["exact"] and done["format"] == "delta"
    assert [evil_id, 1] in done["banned"]
    assert evil_id not in done["bytes_from"]  # nothing it sent was used
