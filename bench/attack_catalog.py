"""What each attack of bench/attacks.py is, and how the bench runs it: the
attacker's arguments, its CPU cap, what it must have done to count as
engaged, when it starts, and its target.

Adding an attack: its coroutine in bench/attacker.py, then its rows here.
"""

from __future__ import annotations

CROWD = 140  # relay_exhaustion's identities

# Attack name -> the attacker's arguments (bench/attacker.py). ``{learner}``
# is the learner's libp2p host:port, ``{api}`` its HTTP API's host:port.
MEMBERS = 8  # the control's peers
ATTACKS: dict[str, list[str]] = {
    "work_flood": ["--in-flight", "16"],
    "sybil_requests": ["--identities", "8"],
    "unanswered_prompts": [],
    "stalling_chunk_peers": ["--identities", "4"],
    # Four peers that send each node one good chunk, then a byte every 2 s.
    "trickling_chunk_peers": ["--identities", "4", "--drip-s", "2"],
    "busy_flapping": ["--identities", "4"],
    "idle_sockets": ["--sockets", "300", "--target", "{learner}"],
    "api_pollers": ["--clients", "8", "--target", "{api}"],
    "api_slowloris": ["--sockets", "64", "--target", "{api}"],
    "idle_members": ["--identities", str(MEMBERS)],
    "decoy_jobs": ["--identities", "3"],
    "wrong_job_spam": ["--identities", "1", "--in-flight", "4"],
    "receipt_flood": ["--in-flight", "8", "--receipts", "200"],
    "relay_exhaustion": ["--identities", str(CROWD), "--wave", "10", "--naming", "1"],
    # Two leechers with empty Haves pulling every chunk from everyone, and one
    # more against the learner under a fresh identity every 5 s.
    "empty_have_leech": ["--identities", "2", "--rotate-s", "5"],
}
CONTROL = "idle_members"  # not an attack: peers that join and ask for nothing (see cpu_cap)
# Attacks that start under SCHED_IDLE alone and are capped at their cap once
# in place (``IN_PLACE``): the control's members, whose
# joining is the costly part. Capped from the start they joined late or
# never: at 0.1 core none of eight had joined by the window's end in six
# runs; at 0.3 their handshakes ran out their deadline and were redone for
# the first ~20 s of it (2026-11-29, 11:15 UTC), a join storm, not idle
# members. They join before the honest nodes, so that the control's window
# opens at a baseline's swarm age.
HELD = {CONTROL}
# Attackers that must follow each version as it is published, to announce
# it: capped at 0.1 core, even once all four followed (they count
# ``following``), they announced too late to be asked: 6 of 7 scenarios not
# engaged, 5 busy answers and 9 good chunks in all (2026-11-29), so they run
# under SCHED_IDLE alone. They take 0.18-0.25 of a
# core, on the core beside the learner's (``--pin``), and with that core
# busier the learner's model work took longer per batch: see
# ``learner_control_ratio`` for what they make the learner itself do.
UNCAPPED = {"stalling_chunk_peers", "trickling_chunk_peers", "busy_flapping"}
# Attacks that need more than --attacker-cores to take hold, and their cap:
# leechers decrypt every chunk they pull (at 0.1 core they pulled nothing;
# uncapped they took 0.74 of this machine's two cores, which no leecher on a
# machine of its own takes from us).
# sybil_requests: eight identities, each joining as a node does (DHT lookups,
# the job's record and manifest read and checked before it takes the job); at
# 0.1 core between them none had asked for work by the end of the window.
CORES = {"empty_have_leech": 0.4, "sybil_requests": 0.3}
# 140 hosts, each with its Noise handshake, all in one process: uncapped; SCHED_IDLE still
# gives the honest processes the CPU first.
UNCAPPED |= {"relay_exhaustion"}
# Bootstrap settings per attack (environment, as an operator could set them).
# relay_exhaustion: on loopback every peer is one source range, so the range
# cap would stop the crowd by itself; raised, the crowd stands for one spread
# over many networks, and the part kept for known peers must hold. Known
# after the default 600 s: the bootstrap and its probe are up from the start
# of the mode's run (bench/standing_relay.py).
BOOTSTRAP_ENV = {"relay_exhaustion": {"ECHO_BOOTSTRAP_RELAY_PER_RANGE": "1000"}}
# Attacks that start before the honest nodes join: they must get in through
# it, or (the control, the relay's crowd) their window must open at a
# baseline's swarm age. The policy's answers shorten as it learns: a relay
# scenario whose crowd came after the nodes opened its window ~25 s later and
# answered 62 tokens a batch against the baselines' 121-142 (2026-11-29).
BEFORE_JOIN = {"idle_sockets", "decoy_jobs", CONTROL, "relay_exhaustion"}
# The counter, and its count, that says an attack started before the nodes
# is in place (else any report at all).
IN_PLACE = {CONTROL: ("joined", MEMBERS), "relay_exhaustion": ("tried", CROWD)}
TARGET = {"api_pollers": 0.9}
# What shows in an attacker's own counters (bench/attacker.py) that it did
# what its attack is: a counter with one of these names or prefixes above 0.
# A stream the learner refused (``failed``) is no attack that took hold.
ENGAGED = {
    "work_flood": ("prompts", "no_work", "error:"),  # requests the learner answered
    "sybil_requests": ("prompts", "no_work", "error:"),
    "unanswered_prompts": ("prompts",),  # prompts held and never answered
    "stalling_chunk_peers": ("stalled",),  # chunk requests taken and never answered
    "trickling_chunk_peers": ("bytes_trickled",),
    "busy_flapping": ("busy",),
    "idle_sockets": ("opened",),
    "api_pollers": ("200", "429", "503"),  # HTTP answers
    "api_slowloris": ("connections",),
    "idle_members": ("joined",),
    "decoy_jobs": ("announced",),
    "wrong_job_spam": ("receipt:",),  # batches the learner read and refused
    "receipt_flood": ("pages",),
    "relay_exhaustion": ("crowd_reserved",),
    "empty_have_leech": ("chunks_pulled",),
}


def engaged(name: str, counters: dict) -> bool:
    """Do ``name``'s attacker's ``counters`` show it did what its attack is?"""
    return any(n > 0 and key.startswith(ENGAGED[name]) for key, n in counters.items() if isinstance(n, int))


def took_hold(name: str, counters: dict) -> bool:
    """Is an attack started before the honest nodes in place: its
    ``IN_PLACE`` counter at its count, or any counter at all?"""
    if name in IN_PLACE:
        key, n = IN_PLACE[name]
        return counters.get(key, 0) >= n
    return bool(counters)
