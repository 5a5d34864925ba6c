"""The peer book: strikes, bans and which peers count as active."""

import pytest

from echo_learner.swarm import peers as peers_module
from echo_learner.swarm.peers import PeerBook
from echo_learner.swarm.sizing import Worker, prompts_for, round_end_s
from echo_learner.verify.verifier import ACCEPTED


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(peers_module.time, "time", c)
    return c


def book() -> PeerBook:
    return PeerBook(strikes_to_ban=3, strike_window_s=300, ban_s=600, max_peers=100)


def test_a_peer_struck_for_lapsed_prompts_is_not_seen_again(clock):
    """A node took the round's prompts and went silent (it waited on a
    version it could not fetch). When they lapse it is struck; the strike
    must not count as hearing from it, or it stays 'active' for one more
    deadline and the sizing model keeps the lapsed prompt for it."""
    deadline_s = 32.0
    b = book()
    b.seen("silent").rate = 128.0  # rollouts/s: the fastest, so the model expects it to take the rest
    b.seen("honest").rate = 64.0
    clock.now += deadline_s + 1  # the silent node's prompt lapses; honest asks again
    b.seen("honest")
    b.strike("silent")
    active = {s.peer for s in b.active(deadline_s)}
    assert active == {"honest"}
    # The honest node now gets the round's last prompt, although it had its
    # share of the round: nobody else is there to take it.
    swarm = [Worker(s.rate / 8, 0.0) for s in b.active(deadline_s)]
    assert prompts_for(64.0, deadline_s, 8, 16, round_ends_in_s=round_end_s(swarm, 1), handed_this_round=4) == 1


def test_three_strikes_ban(clock):
    b = book()
    for _ in range(3):
        assert not b.banned("p")
        b.strike("p")
    assert b.banned("p")
    clock.now += 601
    assert not b.banned("p")


def test_an_outage_is_one_lapse_and_accepted_work_forgives_it(clock):
    """A volunteer's laptop sleeps three times in the strike window, each
    time letting lapse what it held (an assignment, then the one it fetched
    early, seconds later). It is never banned: each outage is one lapse, and
    its accepted batches after each forgive it."""
    deadline_s = 30.0
    b = book()
    for _ in range(3):
        b.lapsed("laptop", deadline_s)
        clock.now += 5
        b.lapsed("laptop", deadline_s)  # the early-fetched assignment: the same outage
        assert not b.banned("laptop")
        clock.now += 40
        b.on_verdict("laptop", ACCEPTED, rollouts=8, tokens=64)
        clock.now += 20
    assert not b.banned("laptop")


def test_a_peer_that_takes_prompts_and_never_answers_is_banned(clock):
    deadline_s = 30.0
    b = book()
    for _ in range(3):
        assert not b.banned("taker")
        b.lapsed("taker", deadline_s)
        clock.now += deadline_s + 1  # it took prompts again, and let them lapse again
    assert b.banned("taker")


def test_lapses_and_refusal_strikes_add_up(clock):
    b = book()
    b.lapsed("p", 30.0)
    b.strike("p")
    assert not b.banned("p")
    b.strike("p")
    assert b.banned("p")


def test_peers_forgotten_past_the_cap_are_told(clock):
    """The learner stops keeping their connections (protocol.net.host.keep_connection)."""
    forgotten = []
    b = PeerBook(strikes_to_ban=3, strike_window_s=300, ban_s=600, max_peers=2, on_forget=forgotten.append)
    for peer in ("a", "b", "a", "c", "d"):
        b.seen(peer)
    assert forgotten == ["b", "a"] and list(b.peers) == ["c", "d"]
