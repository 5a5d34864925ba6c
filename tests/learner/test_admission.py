"""Admission's kept answers equal a full recomputation, whatever happened since.

A random swarm (peers that ask, take prompts, answer, are refused, give
prompts back, fall quiet and come back; rounds that open and close; time
that passes on both clocks) and after every event each figure the learner
sizes and shares work by is derived afresh, the way it was before views
were kept (a scan of the peers and the pool), and compared with the view.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from echo_learner.swarm import admission, peers
from echo_learner.swarm.admission import Admission, RoundModel, Workers
from echo_learner.swarm.peers import PeerBook
from echo_learner.swarm.pool import PromptPool, Rollouts
from echo_learner.swarm.sizing import Worker, prompts_for, round_end_s
from echo_learner.tasks.base import TaskPrompt
from echo_learner.verify.verifier import ACCEPTED, BAD_LOGPROBS

DEADLINE_S = 30.0
GROUP_SIZE = 4

times = st.floats(min_value=0.0, max_value=100.0)
rates = st.floats(min_value=0.01, max_value=10.0)


@given(
    workers=st.lists(st.tuples(times, rates), min_size=1, max_size=40),
    now=times,
    unassigned=st.integers(min_value=0, max_value=200),
)
def test_the_round_model_ends_the_round_when_round_end_s_does(workers, now, unassigned):
    model = RoundModel([end for end, _ in workers], [rate for _, rate in workers])
    expected = round_end_s([Worker(rate, max(0.0, end - now)) for end, rate in workers], unassigned)
    assert model.end_s(now, unassigned) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@given(
    moves=st.lists(
        st.tuples(st.sampled_from("abcdefgh"), st.one_of(st.none(), st.tuples(times, rates))), min_size=1, max_size=60
    ),
    now=times,
    unassigned=st.integers(min_value=0, max_value=200),
)
def test_workers_kept_sorted_one_change_at_a_time_model_the_round_as_if_built_afresh(moves, now, unassigned):
    workers, expected = Workers(), {}
    for name, worker in moves:  # None: the worker leaves
        if worker is None:
            workers.remove(name)
            expected.pop(name, None)
        else:
            workers.set(name, *worker)
            expected[name] = worker
        assert len(workers) == len(expected)
    model = workers.model()
    if not expected:
        assert model is None
        return
    fresh = RoundModel([end for end, _ in expected.values()], [rate for _, rate in expected.values()])
    assert model.end_s(now, unassigned) == pytest.approx(fresh.end_s(now, unassigned), rel=1e-9, abs=1e-9)


class WallClock:
    """``time.time`` for the peer book and admission, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def time(self) -> float:
        return self.now


def recomputed(pool: PromptPool, book: PeerBook, wall: float) -> dict:
    """Every figure of the view, from scratch, as the work handler derived them per request."""
    now = trio.current_time()
    held: Counter[str] = Counter()
    since: dict[str, float] = {}
    for a in pool.unanswered.values():
        if not a.answered and a.deadline >= now and a.version >= pool.min_version:
            held[a.peer] += 1
            since[a.peer] = min(since.get(a.peer, a.handed_at), a.handed_at)
    active = [s for s in book.peers.values() if s.last_seen >= wall - DEADLINE_S]
    proven = {s.peer for s in active if s.accepted > 0}
    unassigned = max(0, pool.capacity - len(pool.buffer) - sum(n for p, n in held.items() if p not in pool.newcomers))
    workers = []
    for s in active:
        if s.rate > 0:
            rate = s.rate / GROUP_SIZE
            workers.append(
                Worker(rate, max(0.0, max(since.get(s.peer, now), s.answered_at) + held[s.peer] / rate - now))
            )
    return {
        "active": {s.peer for s in active},
        "proven": proven,
        "newcomers_hold": sum(n for p, n in held.items() if p not in proven),
        "unassigned": unassigned,
        "round_end_s": round_end_s(workers, unassigned) if workers else None,
    }


def kept(view: admission.View) -> dict:
    return {
        "active": set(view.active),
        "proven": set(view.proven),
        "newcomers_hold": view.newcomers_hold,
        "unassigned": view.unassigned,
        "round_end_s": view.round_ends_in_s(trio.current_time()),
    }


@pytest.mark.parametrize("seed", range(12))
async def test_every_kept_figure_equals_a_full_recomputation(seed, mock_clock, monkeypatch):
    rng = random.Random(seed)
    wall = WallClock()
    monkeypatch.setattr(peers.time, "time", wall.time)
    monkeypatch.setattr(admission.time, "time", wall.time)
    book = PeerBook(strikes_to_ban=100, strike_window_s=60, ban_s=60, max_peers=40, quiet_after_s=DEADLINE_S)
    pool = PromptPool(
        lambda: (TaskPrompt("abc", "cba"), (1, 2, 3)),
        capacity=rng.choice([4, 16, 64]),
        assignment_timeout_s=DEADLINE_S,
        memory=200,
        newcomers=peers.Newcomers(book, DEADLINE_S),
    )
    view = Admission(pool, book, within_s=DEADLINE_S, group_size=GROUP_SIZE)
    names = [f"peer{i}" for i in range(rng.choice([3, 12, 50]))]
    version = 0
    pool.set_open(True, min_version=0)

    def elapse(seconds: float) -> None:
        mock_clock.jump(seconds)
        wall.now += seconds

    for _ in range(300):
        peer = rng.choice(names)
        kind = rng.random()
        if kind < 0.3:  # asks for work (and maybe gets some)
            book.seen(peer)
            if rng.random() < 0.6:  # else it had its share: nothing taken
                pool.take(peer, rng.randint(1, 4), version)
        elif kind < 0.55:  # answers one of its prompts: accepted, or refused
            mine = [a for a in pool.unanswered.values() if a.peer == peer]
            if mine:
                a = rng.choice(mine)
                if rng.random() < 0.8:
                    book.seen(peer).answered_at = trio.current_time()
                    pool.answer(a, Rollouts(version, peer, None))
                    book.on_verdict(peer, ACCEPTED, GROUP_SIZE, 12, rng.uniform(1, 20), rng.uniform(0.5, 10))
                else:
                    pool.release(peer, [a.prompt_id])
                    book.on_verdict(peer, BAD_LOGPROBS, GROUP_SIZE, 0)
        elif kind < 0.65 and pool.buffer:  # a training step takes the buffer
            pool.buffer.clear()
            if rng.random() < 0.5:
                version += 1
                pool.set_open(True, min_version=version - rng.randint(0, 1))
            else:
                pool.set_open(True)
        else:  # time passes: within a deadline, or past one
            elapse(rng.choice([0.01, 0.5, 3.0, DEADLINE_S / 2, DEADLINE_S + 1]))
        got = kept(view.view())
        want = recomputed(pool, book, wall.now)
        assert got.keys() == want.keys()
        for key in ("active", "proven", "newcomers_hold", "unassigned"):
            assert got[key] == want[key], key
        if want["round_end_s"] is None:
            assert got["round_end_s"] is None
        else:
            assert got["round_end_s"] == pytest.approx(want["round_end_s"], rel=1e-9, abs=1e-6)
    # It kept views: far fewer derived than asked for (asked once per event).
    assert view.derived < 300


async def test_a_view_is_kept_until_something_changes(mock_clock):
    pool = PromptPool(lambda: (TaskPrompt("abc", "cba"), (1, 2, 3)), capacity=8, assignment_timeout_s=30, memory=50)
    book = PeerBook(strikes_to_ban=3, strike_window_s=60, ban_s=60, max_peers=10, quiet_after_s=30)
    admissions = Admission(pool, book, within_s=30, group_size=4)
    pool.set_open(True)
    book.seen("a")
    first = admissions.view()
    book.seen("a")  # asks again while active: nothing it depends on changed
    mock_clock.jump(1)
    assert admissions.view() is first
    pool.take("a", 2, version=0)
    assert admissions.view() is not first
    with pytest.raises(ValueError):
        Admission(
            pool,
            PeerBook(strikes_to_ban=3, strike_window_s=60, ban_s=60, max_peers=10, quiet_after_s=31),
            within_s=30,
            group_size=4,
        )


async def test_a_proven_peer_back_after_a_quiet_spell_makes_newcomers_extra_again(mock_clock):
    """Whether a proven peer is around decides if newcomers' prompts count
    against the pool: its return alone, with no other change, must show."""
    book = PeerBook(strikes_to_ban=3, strike_window_s=60, ban_s=60, max_peers=10, quiet_after_s=30)
    pool = PromptPool(
        lambda: (TaskPrompt("abc", "cba"), (1, 2, 3)),
        capacity=8,
        assignment_timeout_s=30,
        memory=50,
        newcomers=peers.Newcomers(book, 30),
    )
    admissions = Admission(pool, book, within_s=30, group_size=4)
    pool.set_open(True)
    book.on_verdict("proven", ACCEPTED, 4, 12)
    book.peers["proven"].last_seen -= 31  # quiet for longer than the window
    book.proven_seen_at -= 31
    book.seen("newcomer")
    pool.take("newcomer", 3, version=0)  # counted against the pool: no proven peer around
    assert admissions.view().unassigned == 5
    book.seen("proven")
    assert admissions.view().unassigned == 8


@pytest.mark.parametrize("seed", range(4))
async def test_a_round_s_last_prompt_goes_to_a_fast_idle_node_whatever_the_clock_reads(seed, mock_clock):
    """Two idle nodes that each had prompts this round, one prompt left: the
    one that finishes a prompt sooner must be handed it (``sizing``). trio's
    clock runs from a large random offset; the round's end as a time minus
    now lost a few 1e-9 of it, and nodes making ~100 prompts a second were
    handed nothing: the sync swarm of tests/test_swarm.py waited for ever."""
    rng = random.Random(seed)
    pool = PromptPool(lambda: (TaskPrompt("abc", "cba"), (1, 2, 3)), capacity=3, assignment_timeout_s=30, memory=50)
    book = PeerBook(strikes_to_ban=3, strike_window_s=60, ban_s=60, max_peers=10, quiet_after_s=30)
    admissions = Admission(pool, book, within_s=30, group_size=16)
    pool.set_open(True)
    misses = []
    for _ in range(50):
        mock_clock.jump(rng.uniform(1e4, 1e6))
        for peer in ("a", "b"):
            book.seen(peer).answered_at = trio.current_time()
            book.peers[peer].rate = rng.uniform(500, 3000)  # rollouts a second
        book.revision += 1  # what on_verdict does with a new rate
        pool.buffer.clear()
        pool.set_open(True)
        for peer in ("a", "b"):
            got = pool.take(peer, 1, version=0)
            pool.answer(got[0], Rollouts(0, peer, None))
        view = admissions.view()
        assert view.unassigned == 1
        now = trio.current_time()
        shares = [
            prompts_for(book.peers[p].rate, 30, 16, 8, round_ends_in_s=view.round_ends_in_s(now), handed_this_round=1)
            for p in ("a", "b")
        ]
        if max(shares) != 1:
            misses.append(shares)
    assert not misses
