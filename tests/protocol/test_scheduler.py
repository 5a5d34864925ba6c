import random

from protocol.broadcast.scheduler import Download, SchedulerConfig, UploadPolicy

ALL = frozenset(range(8))


def download(**config):
    return Download(8, set(), seed="seed", config=SchedulerConfig(**config), rng=random.Random(0))


def test_rarest_chunks_first():
    d = download(max_in_flight=1)
    d.update_peer("seed", ALL)
    d.update_peer("a", frozenset({0, 1, 2, 3, 4, 5, 6}))
    d.update_peer("b", frozenset({0, 1, 2, 3, 4, 5}))
    assert d.next_requests(0.0) == [("seed", 7)]  # only the seed holds chunk 7


def test_relays_before_the_seed_and_bounds_in_flight():
    d = download(max_in_flight=8, max_in_flight_per_peer=2)
    d.update_peer("seed", ALL)
    d.update_peer("a", ALL)
    d.update_peer("b", ALL)
    reqs = d.next_requests(0.0)
    per_peer = {p: sum(1 for q, _ in reqs if q == p) for p in ("seed", "a", "b")}
    assert per_peer == {"seed": 2, "a": 2, "b": 2}
    assert len({i for _, i in reqs}) == 6  # never the same chunk twice
    assert d.next_requests(0.0) == []  # every peer is at its bound
    assert reqs[0][0] != "seed"  # equal load: a relay is asked first


def test_bad_chunk_bans_peer_for_this_version():
    d = download()
    d.update_peer("evil", ALL)
    (peer, idx), *_ = d.next_requests(0.0)
    d.on_failed(peer, idx, 0.0, bad=True)
    d.update_peer("evil", ALL)  # announcing again does not help
    d.remove_peer("evil")
    d.update_peer("evil", ALL)  # nor reconnecting
    assert all(p != "evil" for p, _ in d.next_requests(10.0))
    d.update_peer("good", ALL)
    assert {p for p, _ in d.next_requests(10.0)} == {"good"}


def test_busy_peer_rests_and_declined_chunk_goes_elsewhere():
    d = download(max_in_flight=1, busy_backoff_s=0.5)
    d.update_peer("seed", ALL)
    [(peer, idx)] = d.next_requests(0.0)
    d.on_failed(peer, idx, 0.0, declined=True)
    [(peer2, idx2)] = d.next_requests(0.0)
    assert peer2 == "seed" and idx2 != idx  # other chunks from the same peer
    d.on_failed(peer2, idx2, 0.0, busy=True)
    assert d.next_requests(0.1) == []  # resting
    assert d.next_wakeup(0.1) == 0.5
    assert d.next_requests(0.6)


def test_a_peer_that_only_answers_busy_rests_longer_than_one_that_delivers():
    d = download(max_in_flight=1, busy_backoff_s=0.5, busy_backoff_max_s=1.0, busy_stranger_max_s=8.0)
    d.update_peer("flapper", ALL)
    d.update_peer("honest", ALL)
    [(first, idx)] = d.next_requests(0.0)
    d.on_done(first, idx)  # one of them delivered once
    other = "flapper" if first == "honest" else "honest"
    now = 0.0
    for _ in range(6):  # busy answers in a row from both
        for peer in (first, other):
            d.on_failed(peer, idx + 1, now, busy=True)
    assert d.peers[first].resting_until == now + 1.0  # it has delivered: at most 1 s
    assert d.peers[other].resting_until == now + 8.0  # a stranger rests up to 8 s


def test_a_busy_strangers_rest_carries_over_to_the_next_version():
    old = download(max_in_flight=1, busy_backoff_s=0.5, busy_stranger_max_s=8.0)
    old.update_peer("flapper", ALL)
    old.update_peer("honest", ALL)
    for _ in range(5):
        for peer in ("flapper", "honest"):
            old.on_failed(peer, 0, 0.0, busy=True)
    [(peer, idx)] = old.next_requests(9.0)
    old.on_done(peer, idx)  # one of them delivers: it is no stranger
    carried = old.busy_strangers()
    other = "flapper" if peer == "honest" else "honest"
    assert set(carried) == {other} and carried[other] == (8.0, 5)
    new = download(max_in_flight=1, busy_backoff_s=0.5, busy_stranger_max_s=8.0)
    new.rested = carried
    new.update_peer(other, ALL)
    assert new.next_requests(7.9) == []  # still resting from the last version
    assert new.next_requests(8.0)
    new.on_failed(other, 0, 8.0, busy=True)
    assert new.peers[other].resting_until == 16.0  # the streak goes on: the longest rest at once


def test_done_and_complete():
    d = download()
    d.update_peer("a", ALL)
    while not d.complete:
        for peer, idx in d.next_requests(0.0):
            d.on_done(peer, idx)
    assert d.have == set(ALL) and not d.in_flight


def test_seed_pushes_every_chunk_once_before_any_twice():
    p = UploadPolicy(n_chunks=3, max_admitted=10, is_seed=True)
    assert p.allow(0, holders=0, peer="a") == "ok"
    assert p.allow(0, holders=0, peer="b") == "ask_others"  # already on its way to someone
    p.finished(0, ok=True)
    assert p.allow(0, holders=1, peer="c") == "ask_others"  # a neighbour holds it
    assert p.allow(1, holders=0) == "ok" and p.allow(2, holders=0) == "ok"
    p.finished(1, ok=True)
    p.finished(2, ok=True)
    assert p.allow(0, holders=1) == "ok"  # every chunk went out once
    p.finished(0, ok=False)  # a failed copy does not count
    assert p.served == [1, 1, 1]


def test_seed_advises_each_peer_once_per_chunk_then_serves():
    # Neighbours that announce every chunk and serve none must not make the
    # seed send a requester away for ever.
    p = UploadPolicy(n_chunks=2, max_admitted=10, is_seed=True)
    assert p.allow(0, holders=0, peer="a") == "ok"
    assert p.allow(0, holders=4, peer="b") == "ask_others"
    assert p.allow(0, holders=4, peer="c") == "ask_others"
    assert p.allow(0, holders=4, peer="b") == "ok"  # b found no one else


def test_seed_serves_again_a_chunk_nobody_holds():
    p = UploadPolicy(n_chunks=2, max_admitted=10, is_seed=True)
    assert p.allow(0, holders=0) == "ok"
    p.finished(0, ok=True)
    assert p.allow(0, holders=0) == "ok"  # e.g. the only receiver left the swarm


def test_queue_bound():
    p = UploadPolicy(n_chunks=4, max_admitted=2, is_seed=False)
    assert [p.allow(i, holders=5) for i in range(3)] == ["ok", "ok", "busy"]
    p.finished(0, ok=True)
    assert p.allow(3, holders=5) == "ok"


def test_a_stalling_peer_is_dropped_for_the_version():
    d = download(max_in_flight=1)
    d.update_peer("staller", ALL)
    [(peer, idx)] = d.next_requests(0.0)
    d.on_failed(peer, idx, 0.0, stalled=True)
    d.update_peer("staller", ALL)  # announcing again does not help
    assert d.next_requests(100.0) == []
    d.update_peer("seed", ALL)
    assert [p for p, _ in d.next_requests(100.0)] == ["seed"]


def test_a_stalling_seed_rests_and_is_asked_again():
    """The learner may be the only holder: a stall means it was busy."""
    d = download(max_in_flight=1, failure_backoff_s=1.0)
    d.update_peer("seed", ALL)
    [(peer, idx)] = d.next_requests(0.0)
    d.on_failed(peer, idx, 0.0, stalled=True)
    assert d.next_requests(0.5) == []  # resting
    assert d.next_requests(1.5) == [("seed", idx)]


def test_endgame_asks_a_second_holder_for_an_old_request():
    d = Download(2, {0}, seed="seed", config=SchedulerConfig(endgame_after_s=2.0), rng=random.Random(0))
    d.update_peer("staller", frozenset({1}))
    assert d.next_requests(0.0) == [("staller", 1)]
    d.update_peer("seed", frozenset({0, 1}))
    assert d.next_requests(1.0) == []  # too young for a copy
    assert d.next_wakeup(1.0) == 2.0
    assert d.next_requests(2.5) == [("seed", 1)]
    assert d.next_requests(9.0) == []  # one copy at most
    d.on_done("seed", 1)
    assert d.complete
    d.on_failed("staller", 1, 10.0, stalled=True)  # the first request ends later
    assert d.in_flight == {} and d.duplicates == {}


def test_the_endgame_copy_goes_to_the_seed_not_to_another_untried_announcer():
    d = Download(2, {0}, seed="seed", config=SchedulerConfig(endgame_after_s=1.0), rng=random.Random(0))
    for peer in ("staller1", "staller2", "seed"):
        d.update_peer(peer, frozenset({0, 1}))
    [(first, _)] = d.next_requests(0.0)
    assert first != "seed"  # an untried peer first: it may relay
    assert d.next_requests(2.0) == [("seed", 1)]  # not the other untried peer
    d.on_failed("seed", 1, 2.1, declined=True)
    assert d.next_requests(2.12) == []  # nor while the seed declines
    assert d.next_requests(2.2) == [("seed", 1)]



def test_the_endgame_waits_a_few_typical_request_times():
    d = Download(4, set(), seed="seed", config=SchedulerConfig(endgame_factor=4.0), rng=random.Random(0))
    d.update_peer("seed", ALL & frozenset(range(4)))
    for peer, idx in d.next_requests(0.0)[:3]:
        d.on_done(peer, idx, 0.1)  # typical requests take 0.1 s
    assert d.endgame_after_s == 0.4


def test_peers_that_served_us_before_are_asked_first():
    d = download(max_in_flight=4, max_in_flight_per_peer=1)
    d.trusted |= {"old friend", "seed"}
    for peer in ("stranger", "old friend", "seed"):
        d.update_peer(peer, ALL)
    assert sorted(p for p, _ in d.next_requests(0.0)) == ["old friend", "seed", "stranger"]
    d = download(max_in_flight=2, max_in_flight_per_peer=1)
    d.trusted |= {"old friend", "seed"}
    for peer in ("stranger", "old friend", "seed"):
        d.update_peer(peer, ALL)
    assert sorted(p for p, _ in d.next_requests(0.0)) == ["old friend", "seed"]  # strangers wait
