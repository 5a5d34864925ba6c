"""Fair shares of the prompt pool: one greedy peer, or many fresh identities,
cannot take what honest nodes need."""

from collections import Counter

from echo_learner.swarm.fairness import room

POOL = dict(capacity=16, per_request=4, newcomer_share=0.25)


def test_a_lone_node_may_take_the_whole_pool():
    assert room("a", active=["a"], proven=[], held=Counter(), **POOL) == 16
    assert room("a", active=["a"], proven=["a"], held=Counter(a=12), **POOL) == 4


def test_a_peer_with_many_requests_in_flight_gets_only_its_share():
    active, proven = ["greedy", "h1", "h2", "h3"], ["greedy", "h1", "h2", "h3"]
    assert room("greedy", active=active, proven=proven, held=Counter(greedy=4), **POOL) == 0
    # The honest ones still get theirs while the greedy one holds its share.
    assert room("h1", active=active, proven=proven, held=Counter(greedy=4, h2=4), **POOL) == 4


def test_a_share_is_never_below_one_request():
    active = [f"p{i}" for i in range(40)]
    assert room("p0", active=active, proven=active, held=Counter(), **POOL) == 4


def test_fresh_identities_share_a_small_pool_while_proven_peers_ask():
    sybils = [f"s{i}" for i in range(8)]
    active, proven = ["h1", "h2", "h3", *sybils], ["h1", "h2", "h3"]
    held = Counter(s0=2, s1=2)  # newcomers' share of 16 x 0.25 = 4 is taken
    assert room("s2", active=active, proven=proven, held=held, **POOL) == 0
    # Proven peers divide the pool among themselves: 16 / 3, not 16 / 11.
    assert room("h1", active=active, proven=proven, held=held, **POOL) == 6
    # A swarm that is just starting has no proven peer: nobody is held back.
    assert room("s2", active=sybils, proven=[], held=held, **POOL) == 4
