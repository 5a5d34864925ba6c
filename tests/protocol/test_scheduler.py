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


def test_done_and_complete():
    d = download()
    d.update_peer("a", ALL)
    while not d.complete:
        for peer, idx in d.next_requests(0.0):
            d.on_done(peer, idx)
    assert d.have == set(ALL) and not d.in_flight


def test_seed_pushes_every_chunk_once_before_any_twice():
    p = UploadPolicy(n_chunks=3, max_admitted=10, is_seed=True)
    assert p.allow(0, holders=0) == "ok"
    assert p.allow(0, holders=0) == "ask_others"  # already on its way to someone
    p.finished(0, ok=True)
    assert p.allow(0, holders=1) == "ask_others"  # a neighbour holds it
    assert p.allow(1, holders=0) == "ok" and p.allow(2, holders=0) == "ok"
    p.finished(1, ok=True)
    p.finished(2, ok=True)
    assert p.allow(0, holders=1) == "ok"  # every chunk went out once
    p.finished(0, ok=False)  # a failed copy does not count
    assert p.served == [1, 1, 1]


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
