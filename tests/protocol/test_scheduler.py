import random
from collections import Counter

from protocol.broadcast import bitfield
from protocol.broadcast.records import PeerRecords
from protocol.broadcast.scheduler import Download, SchedulerConfig
from protocol.broadcast.uploads import UploadPolicy, UploadQueue

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
    assert per_peer == {"seed": 2, "a": 1, "b": 1}  # a and b are strangers so far
    assert len({i for _, i in reqs}) == 4  # never the same chunk twice
    assert d.next_requests(0.0) == []  # every peer is at its bound
    assert reqs[0][0] != "seed"  # equal load: a relay is asked first
    for peer, idx in reqs:
        if peer != "seed":
            d.on_done(peer, idx, 1.0)
    reqs = d.next_requests(1.0)  # both have served us: two requests each now
    assert sorted(p for p, _ in reqs) == ["a", "a", "b", "b"]


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


def test_seed_offers_each_chunk_once_before_any_twice():
    p = UploadPolicy(n_chunks=3, max_admitted=10, is_seed=True)
    assert p.offered() == {0, 1, 2}
    assert p.allow(0) == "ok"
    assert p.offered() == {1, 2}  # announced no more until the round ends
    assert p.allow(0) == "ask_others"  # a requester that saw an older Have
    p.finished(0, ok=True)
    assert p.allow(1) == "ok"
    assert p.offered() == {2}
    assert p.allow(2) == "ok"
    assert p.offered() == frozenset()  # the last first copies have the uplink to themselves
    p.finished(1, ok=True)
    assert p.offered() == frozenset()
    p.finished(2, ok=True)
    assert p.offered() == {0, 1, 2}  # every chunk went out once: the next round
    assert p.allow(0) == "ok"
    p.finished(0, ok=False)  # a failed copy does not count
    assert p.served == [1, 1, 1] and p.offered() == {0, 1, 2}


def test_a_requester_that_asks_the_seed_again_gets_the_chunk():
    p = UploadPolicy(n_chunks=2, max_admitted=10, is_seed=True)
    assert p.allow(0, "relay") == "ok"
    p.finished(0, ok=True)
    assert p.allow(0, "late") == "ask_others"  # the swarm relays it
    assert p.allow(0, "other") == "ask_others"
    assert p.allow(0, "late") == "ok"  # asked again: it found nobody else to fetch it from
    p.finished(0, ok=True)
    assert p.allow(0, "late") == "ask_others"  # once per decline


def test_a_chunk_only_dropped_peers_hold_comes_from_the_seed():
    """The seed sent chunk 0 to two nodes this round and no longer offers it;
    a third node dropped both for stalling. The round never ends (everyone
    holds chunk 1: nobody asks for it), so without a fallback the third node
    waited for the next version and let its assigned prompts lapse
    (bench/convergence.py, sync mode: 72 s without a step)."""
    seed = UploadPolicy(n_chunks=2, max_admitted=10, is_seed=True)
    for relay, idx in (("a", 0), ("a", 1), ("b", 0)):
        assert seed.allow(idx, relay) == "ok"
        seed.finished(idx, ok=True)
    assert seed.offered() == {1}  # round 1; a relays chunk 1 to b and to the third node

    d = Download(2, {1}, seed="seed", rng=random.Random(0))
    d.update_peer("seed", frozenset({0, 1}))  # the seed's Have before b's copy
    for relay in ("a", "b"):
        d.update_peer(relay, frozenset({0, 1}))
        d.drop(relay)  # stalled: asked for nothing more of this version
    assert d.next_requests(0.0) == [("seed", 0)]
    assert seed.allow(0, "late") == "ask_others"
    d.on_failed("seed", 0, 0.1, declined=True)
    d.update_peer("seed", seed.offered())  # its newer Have: chunk 0 no longer offered
    assert d.next_requests(1.0) == []  # others may relay it
    retry = d.next_wakeup(1.0)
    assert retry == 0.1 + d.config.seed_retry_s
    assert d.next_requests(retry) == [("seed", 0)]  # nobody did: the seed it is
    assert seed.allow(0, "late") == "ok"
    d.on_done("seed", 0, retry + 0.1)
    assert d.complete


def test_a_chunk_nobody_announces_is_asked_of_the_seed_in_time():
    d = Download(2, set(), seed="seed", rng=random.Random(0))
    d.update_peer("seed", frozenset({1}))  # chunk 0 went out this round; its holder left
    assert d.next_requests(0.0) == [("seed", 1)]
    assert d.next_wakeup(0.0) == d.config.seed_retry_s
    assert d.next_requests(d.config.seed_retry_s) == [("seed", 0)]


def test_a_failed_first_copy_is_offered_again():
    p = UploadPolicy(n_chunks=2, max_admitted=10, is_seed=True)
    assert p.allow(0) == "ok"
    p.finished(0, ok=False)  # e.g. the only receiver left mid-chunk
    assert p.offered() == {0, 1} and p.allow(0) == "ok"


def test_the_seeds_first_round_goes_to_peers_that_can_relay():
    p = UploadPolicy(n_chunks=2, max_admitted=10, is_seed=True)
    assert p.allow(0, "direct") == "ok"
    assert p.allow(1, "relayed", weak=True) == "busy"  # capped uplink: the direct peer first
    p.finished(0, ok=True)
    assert p.allow(1, "relayed", weak=True) == "ok"  # nobody else is asking: never starved
    p.finished(1, ok=True, weak=True)
    assert p.allow(0, "direct") == "ok"  # the next round
    assert p.allow(1, "relayed", weak=True) == "ok"  # after the first round, anyone


def test_a_relay_serves_every_chunk_it_holds():
    p = UploadPolicy(n_chunks=2, max_admitted=10, is_seed=False)
    assert [p.allow(0), p.allow(0, "r", weak=True), p.allow(1)] == ["ok", "ok", "ok"]
    assert p.offered() == {0, 1}


def test_queue_bound():
    p = UploadPolicy(n_chunks=4, max_admitted=2, is_seed=False)
    assert [p.allow(i) for i in range(3)] == ["ok", "ok", "busy"]
    p.finished(0, ok=True)
    assert p.allow(3) == "ok"


def test_uploads_start_furthest_behind_first_within_bounds():
    q = UploadQueue(slots=1)
    q.push(5, "first")
    assert q.pop_ready() == ["first"]
    q.push(2, "holds 2 of ours")
    q.push(0, "holds none")
    q.push(9, "given up")
    q.remove("given up")  # it still counts as one that came after
    q.push(0, "holds none either")
    assert q.pop_ready() == []  # the slot is taken
    order = []
    for _ in range(3):
        q.done()
        order += q.pop_ready()
    # Two later requests go first, then the one holding two waits no longer.
    assert order == ["holds none", "holds 2 of ours", "holds none either"] and len(q) == 0


def test_a_relay_ranks_requesters_by_the_chunks_they_share_with_it():
    ours = bitfield.encode({0, 1, 2, 5, 9}, 12)
    assert bitfield.common(ours, bitfield.encode({1, 5, 9, 10, 11}, 12)) == 3
    assert bitfield.common(ours, bitfield.encode(set(), 12)) == 0
    relay = UploadPolicy(n_chunks=12, max_admitted=4, is_seed=False)
    assert relay.priority("behind", shared=0) < relay.priority("ahead", shared=3)


def test_strangers_get_few_requests():
    d = download(max_in_flight=8, max_in_flight_per_stranger=1, max_stranger_requests=2)
    for peer in ("s1", "s2", "s3", "s4"):
        d.update_peer(peer, ALL)
    reqs = d.next_requests(0.0)
    assert len(reqs) == 2 and len({p for p, _ in reqs}) == 2  # one each, two in all
    peer, idx = reqs[0]
    d.on_done(peer, idx, 0.5)  # it delivered: no stranger any more
    more = d.next_requests(0.5)
    assert sum(1 for p, _ in more if p == peer) == 2  # the full per-peer limit
    assert len([p for p, _ in more if p != peer]) == 1  # and one stranger slot freed


def test_the_peer_expected_to_deliver_soonest_is_asked():
    d = download(max_in_flight=1, max_in_flight_per_peer=4)
    d.update_peer("fast", ALL)
    d.update_peer("slow", ALL)
    d.trusted |= {"fast", "slow"}
    d.peers["fast"].speed, d.peers["slow"].speed = 10.0, 1.0  # chunks per second
    assert [p for p, _ in d.next_requests(0.0)] == ["fast"]
    d = download(max_in_flight=8, max_in_flight_per_peer=8)
    d.update_peer("fast", ALL)
    d.update_peer("slow", ALL)
    d.trusted |= {"fast", "slow"}
    d.peers["fast"].speed, d.peers["slow"].speed = 3.0, 1.0
    picks = [p for p, _ in d.next_requests(0.0)]
    # Three requests to "fast" end as soon as one to "slow": 6 and 2.
    assert picks.count("fast") == 6 and picks.count("slow") == 2


def test_throughput_is_measured_per_peer():
    d = download(max_in_flight=2, max_in_flight_per_peer=2)
    d.update_peer("a", ALL)
    d.trusted.add("a")
    (p1, i1), (p2, i2) = d.next_requests(0.0)
    d.on_done("a", i1, 0.5)  # two open requests, the first done in 0.5 s: 4 chunks/s
    assert d.peers["a"].speed == 4.0


def test_request_timeouts_follow_measured_request_times():
    d = download(timeout_initial_s=3.0, timeout_factor=4.0, timeout_min_s=1.0, timeout_max_s=10.0)
    d.update_peer("a", ALL)
    d.update_peer("b", ALL)
    assert d.request_timeout("b") == 3.0  # nothing measured yet
    [(peer, idx), *_] = [r for r in d.next_requests(0.0) if r[0] == "a"]
    d.on_done("a", idx, 0.5)
    assert d.request_timeout("b") == 2.0  # 4 x the typical request (0.5 s)
    assert d.request_timeout("a") == 4 * max(1, d.peers["a"].in_flight) / d.peers["a"].speed
    d.relayed.add("c")
    d.update_peer("c", ALL)
    assert d.request_timeout("c") == 10.0  # a relay's share may be far below the typical


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
    # The stranger's request is still open: the seed, asked twice, serves it.
    assert d.next_requests(2.2) == [("seed", 1)]


def test_a_strangers_request_for_a_chunk_the_seed_no_longer_announces_is_copied_to_the_seed():
    """Four peers that announced every chunk and never sent one held each
    node's version for a whole timeout once each, where the seed serves a
    chunk asked of it twice (bench/attacks.py stalling_chunk_peers)."""
    config = SchedulerConfig(endgame_after_s=1.0, timeout_initial_s=3.0)
    d = Download(2, {0}, seed="seed", config=config, rng=random.Random(0))
    d.trusted |= {"seed"}
    d.update_peer("stranger", frozenset({0, 1}))
    d.update_peer("seed", frozenset())  # its round went out: it announces nothing
    assert d.next_requests(0.0) == [("stranger", 1)]
    assert d.request_timeout("stranger") == 3.0  # the stranger's verdict comes this late
    assert d.next_wakeup(0.0) == 1.0
    assert d.next_requests(0.9) == []
    assert d.next_requests(1.0) == [("seed", 1)]  # the version does not wait for it
    d.on_done("seed", 1, 1.2)
    assert d.complete and d.in_flight == {1: "stranger"}  # its request runs on to its verdict


def test_a_slow_request_to_a_proven_peer_waits_for_a_declining_seed():
    config = SchedulerConfig(endgame_after_s=1.0, proven_chunks=3)
    d = Download(
        2, {0}, seed="seed", config=config, rng=random.Random(0), records=PeerRecords(Counter({"old friend": 3}))
    )
    d.trusted |= {"old friend"}
    d.update_peer("old friend", frozenset({0, 1}))
    d.update_peer("seed", frozenset())  # it announces nothing: its round went out
    assert d.next_requests(0.0) == [("old friend", 1)]
    d.on_failed("seed", 1, 0.5, declined=True)  # it declined chunk 1 before
    assert d.next_requests(1.5) == []  # a proven peer is only slow: the seed's decline holds
    assert d.next_wakeup(1.5) == 0.5 + config.seed_retry_s


def test_a_peer_whose_requests_fail_as_often_as_it_delivers_is_asked_after_the_others():
    records = PeerRecords(served=Counter({"a": 5, "b": 5}))

    def version(n_chunks: int = 2) -> Download:
        config = SchedulerConfig(max_in_flight=1)
        d = Download(n_chunks, set(), seed="seed", config=config, rng=random.Random(0), records=records)
        d.trusted |= {"a", "b"}
        for peer in ("a", "b"):
            d.update_peer(peer, frozenset(range(n_chunks)))
        return d

    d = version()
    [(first, idx)] = d.next_requests(0.0)
    other = "b" if first == "a" else "a"
    for t in range(5):  # overtaken four times, stalled once: as often as it delivered
        d.on_failed(first, idx, 1.0, overtaken=t < 4, stalled=t == 4)
        d = version()
        [(peer, idx)] = d.next_requests(0.0)
        if t < 4:
            assert peer == first  # an honest peer overtaken now and then keeps its place
    assert records.failures == {first: 5}
    assert peer == other  # the next versions (the record is the engine's) ask the other first
    d.peers[other].banned = True  # only the doubtful peer is left: it is still asked
    d.on_failed(other, idx, 0.1)
    [(peer, idx)] = d.next_requests(0.0)
    assert peer == first
    records.served[first] += 1  # it delivered once more (ChunkRequests counts good chunks)
    d = version()
    [(peer, _)] = d.next_requests(0.0)
    assert peer in {"a", "b"} and not records.doubtful(first)


def test_a_chunk_only_doubtful_peers_announce_is_asked_of_the_seed_at_once():
    config = SchedulerConfig(seed_retry_s=2.0)
    for failures, asked in ((Counter({"trickler": 1}), "seed"), (Counter(), "trickler")):
        d = Download(
            2,
            {0},
            seed="seed",
            config=config,
            rng=random.Random(0),
            records=PeerRecords(Counter({"trickler": 1}), failures),
        )
        d.trusted |= {"trickler", "seed"}
        d.update_peer("trickler", frozenset({0, 1}))  # it took the seed's one copy of chunk 1
        d.update_peer("seed", frozenset())  # and the seed announces it no more
        # A trickler (one good chunk, then a failed request) is not waited
        # for, nor is seed_retry_s; a peer with a clean record is asked.
        assert d.next_requests(0.0) == [(asked, 1)]


def test_a_peer_with_a_record_is_asked_before_one_with_a_single_good_chunk():
    config = SchedulerConfig(max_in_flight=1, proven_chunks=3)
    for record in ({"honest": 3, "trickler": 1}, {"honest": 40, "trickler": 2}):
        d = Download(8, set(), seed="seed", config=config, rng=random.Random(0), records=PeerRecords(Counter(record)))
        d.trusted |= {"honest", "trickler"}
        d.update_peer("trickler", ALL)
        d.update_peer("honest", ALL)
        assert [p for p, _ in d.next_requests(0.0)] == ["honest"]


def test_a_request_to_a_doubtful_peer_is_copied_after_one_typical_request_time():
    config = SchedulerConfig(endgame_factor=4.0, endgame_min_s=0.25, proven_chunks=3)
    d = Download(
        3,
        set(),
        seed="seed",
        config=config,
        rng=random.Random(0),
        records=PeerRecords(Counter({"friend": 9, "newcomer": 1})),
    )
    d.trusted |= {"friend", "newcomer", "seed"}
    d.update_peer("friend", frozenset({0, 1}))
    d.update_peer("newcomer", frozenset({2}))
    d.update_peer("seed", frozenset())
    requests = dict((idx, p) for p, idx in d.next_requests(0.0))
    assert requests == {0: "friend", 1: "friend", 2: "newcomer"}
    d.on_done("friend", 0, 0.5)
    d.on_done("friend", 1, 0.5)  # a typical request takes 0.5 s: the endgame waits 2 s
    assert d.endgame_after_s == 2.0
    assert d.next_wakeup(0.4) == 0.5  # but the newcomer's is copied one typical request time in
    assert d.next_requests(0.4) == []
    assert d.next_requests(0.5) == [("seed", 2)]  # the seed holds every chunk, announced or not


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


def test_the_seed_serves_first_whom_it_has_sent_least():
    p = UploadPolicy(n_chunks=8, max_admitted=10, is_seed=True)
    for idx in range(3):
        assert p.allow(idx, "a") == "ok"
    assert p.allow(3, "b") == "ok"
    assert p.priority("a", shared=0) == 3 and p.priority("b", shared=0) == 1
    assert p.priority("c", shared=5) == 0  # nothing sent yet: first in line
    relay = UploadPolicy(n_chunks=8, max_admitted=10, is_seed=False)
    assert relay.priority("a", shared=5) == 5  # a relay serves first who lacks most of its chunks


def test_fast_uplinks_get_more_slots_and_neighbours():
    from protocol.broadcast.settings import BroadcastConfig

    c = BroadcastConfig()
    assert (c.slots(0), c.admitted(0), c.neighbour_limit(0)) == (2, 6, 16)  # uncapped: unknown
    assert (c.slots(20), c.admitted(20), c.neighbour_limit(20)) == (2, 6, 16)
    assert (c.slots(200), c.admitted(200), c.neighbour_limit(200)) == (20, 60, 128)
    assert c.neighbour_limit(50) == 40
    assert (c.accept_limit(0), c.accept_limit(200)) == (32, 256)  # peers that dial us: room beyond our own dials
    assert c.admitted(20, seed=True) == 32 * 2  # every neighbour's requests
