"""What a chunk request that another peer's copy overtook counts as.

Real hosts over loopback: a holder that takes the request, sends nothing (or
one piece) and holds the rest, and the requester's ``ChunkRequests``. When the
chunk arrives from elsewhere meanwhile (``cancel_copies``, the endgame), a
peer that vouches for itself (``trusted``: it has sent us good chunks, more
than requests to it failed) was only slower this once and must not be
struck for it (honest nodes on a busy machine banned each other that way).
Any other peer's request with no byte yet runs on until it answers (an
honest peer), times out (a staller) or falls behind the pace a chunk must
keep (a trickler). And a peer whose bytes trickle slower than that pace has
stalled, trusted or not, the moment they fall behind.
"""

import pytest
import trio
import trio.testing
from libp2p.peer.peerinfo import PeerInfo

from protocol.broadcast import requests as outcomes
from protocol.broadcast.requests import ChunkRequests
from protocol.broadcast.settings import Stats
from protocol.broadcast.store import VersionStore
from protocol.identity import Identity
from protocol.net.swarm import open_swarm
from protocol.wire import chunk
from protocol.wire.chunk import ChunkData
from tests.protocol.samples import LEARNER, patterned_version

JOB = "reverse-test"
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
CHUNK = 4096


class Holder:
    """Takes each chunk request, sends ``pieces`` pieces of it
    (``piece_bytes`` each), then holds the rest until ``release`` is set;
    or, given ``trickle_s``, sends one piece every ``trickle_s`` and is
    holding after ``trickled`` of them."""

    def __init__(
        self, chunks: list[bytes], pieces: int, piece_bytes: int = 256, trickle_s: float = 0.0, trickled: int = 0
    ):
        self.chunks, self.pieces, self.piece_bytes = chunks, pieces, piece_bytes
        self.trickle_s, self.trickled = trickle_s, trickled
        self.holding, self.release = trio.Event(), trio.Event()

    async def handle(self, stream) -> None:
        request = await chunk.next_request(stream)
        sent = 0

        async def before_piece(n: int) -> None:
            nonlocal sent
            if self.trickle_s and sent >= self.pieces:
                if sent == self.pieces + self.trickled:
                    self.holding.set()
                await trio.sleep(self.trickle_s)  # the trickler's pace, not synchronisation
            elif sent == self.pieces:
                self.holding.set()
                await self.release.wait()
            sent += 1

        data = self.chunks[request.index]
        await chunk.send_chunk(
            stream,
            ChunkData(JOB, request.version, request.index, data),
            piece_bytes=self.piece_bytes,
            before_piece=before_piece,
        )


async def ask(
    tmp_path,
    *,
    pieces: int,
    trusted: bool,
    overtake: bool,
    answer_after: bool,
    timeout_s: float,
    stall_s: float = 30.0,
    min_bytes_per_s: float = 1024.0,
    **holding,
):
    """One request to a holder (``Holder(pieces=pieces, **holding)``). Once
    the holder holds, the copy from elsewhere comes (if ``overtake``), then
    the holder sends the rest (if ``answer_after``). Returns (outcome, stalls
    counted)."""
    m, chunks = patterned_version(JOB, chunk_size=CHUNK, n_chunks=2)
    store = VersionStore(tmp_path, learner_id=LEARNER.peer_id_str, keep=2)
    store.add_manifest(m)
    holder = Holder(chunks, pieces, **holding)
    async with (
        open_swarm(Identity.generate(), LOOPBACK, server=True) as client,
        open_swarm(Identity.generate(), LOOPBACK, server=True) as holder_swarm,
        trio.open_nursery() as nursery,
    ):
        holder_swarm.host.set_stream_handler(chunk.PROTOCOL, holder.handle)
        peer = holder_swarm.host.get_id().to_base58()
        await client.host.connect(PeerInfo(holder_swarm.host.get_id(), holder_swarm.host.get_addrs()))
        stats = Stats()
        requests = ChunkRequests(client, store, JOB, stall_s=stall_s, min_bytes_per_s=min_bytes_per_s, stats=stats)
        outcome, done = [], trio.Event()

        async def request() -> None:
            outcome.append(
                await requests.request(
                    m,
                    peer,
                    0,
                    timeout_s,
                    guessed=False,
                    is_neighbour=lambda p: True,
                    announces=lambda p, m, idx: True,
                    trusted=lambda p: trusted,
                )
            )
            done.set()

        nursery.start_soon(request)
        with trio.fail_after(timeout_s + 10):
            await holder.holding.wait()
        await trio.testing.wait_all_tasks_blocked(0.05)  # the pieces sent are read
        if overtake:
            store.save_chunk(m, 0, chunks[0])  # another peer's copy
            store.mark_held(m.version, 0)
            requests.cancel_copies(0, done_by="another peer")
        if answer_after:
            await trio.testing.wait_all_tasks_blocked(0.05)
            assert not done.is_set()  # it was left to run
            holder.release.set()
        with trio.fail_after(timeout_s + stall_s + CHUNK / min_bytes_per_s + 10):
            await done.wait()
        holder.release.set()
        nursery.cancel_scope.cancel()
    return outcome[0], stats.stalls[peer]


@pytest.mark.parametrize(
    "pieces, trusted, answer_after, timeout_s, expected",
    [
        (0, True, False, 30.0, outcomes.OVERTAKEN),  # it has served us: slower this once
        (1, False, False, 30.0, outcomes.OVERTAKEN),  # a stranger whose bytes were flowing: no duplicate
        (0, False, True, 30.0, outcomes.OK),  # a stranger, slow but honest: it answers
        (0, False, False, 1.0, outcomes.STALLED),  # a stranger that never sends: its timeout
    ],
)
async def test_a_request_overtaken_by_another_copy(tmp_path, pieces, trusted, answer_after, timeout_s, expected):
    outcome, stalls = await ask(
        tmp_path, pieces=pieces, trusted=trusted, overtake=True, answer_after=answer_after, timeout_s=timeout_s
    )
    assert (outcome, stalls) == (expected, 1 if expected == outcomes.STALLED else 0)


async def test_a_trusted_peer_that_outlasts_its_timeout_has_stalled(tmp_path):
    outcome, stalls = await ask(tmp_path, pieces=0, trusted=True, overtake=False, answer_after=False, timeout_s=0.5)
    assert (outcome, stalls) == (outcomes.STALLED, 1)


# A trickler: 256 bytes at once, then one byte every 0.25 s, inside a 1 s
# stall timer; a chunk must come at 1 KiB/s once its bytes flow (4 s for
# these 4 KiB, after 1 s of grace).
TRICKLE = dict(pieces=256, piece_bytes=1, trickle_s=0.25, stall_s=1.0, min_bytes_per_s=1024.0)


async def test_a_peer_that_trickles_has_stalled_once_its_bytes_fall_behind_the_pace(tmp_path):
    started = trio.current_time()
    outcome, stalls = await ask(tmp_path, trusted=True, overtake=False, answer_after=False, timeout_s=30.0, **TRICKLE)
    assert (outcome, stalls) == (outcomes.STALLED, 1)
    # It is cut once its 256 bytes are behind 1 KiB/s after the 1 s of
    # grace (1.25 s after its first byte), not when the whole 4 KiB would be
    # due at that pace (5 s), nor at its own pace (17 minutes).
    assert trio.current_time() - started < 3


@pytest.mark.parametrize(
    "trusted, expected",
    [
        (True, outcomes.OVERTAKEN),  # it vouches for itself: slower this once
        (False, outcomes.STALLED),  # doubtful (a trickler's record): it runs on, and falls behind
    ],
)
async def test_a_trickler_overtaken_before_its_first_byte(tmp_path, trusted, expected):
    # Overtaken before its first byte (it waits 0.5 s before each), then a
    # byte every 0.5 s: the frame's 4-byte length first, so its first chunk
    # byte at 2.5 s and the cut 1 s later, if it runs on.
    started = trio.current_time()
    outcome, stalls = await ask(
        tmp_path,
        trusted=trusted,
        overtake=True,
        answer_after=False,
        timeout_s=30.0,
        **(TRICKLE | dict(pieces=0, trickle_s=0.5)),
    )
    assert (outcome, stalls) == (expected, 1 if expected == outcomes.STALLED else 0)
    assert trio.current_time() - started < 10  # its pace, never its 30 s timeout
