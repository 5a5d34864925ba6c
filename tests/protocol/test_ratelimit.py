import pytest
import trio

from protocol.broadcast.ratelimit import RefusalPace, TokenBucket


async def test_bucket_paces_concurrent_senders(autojump_clock):
    bucket = TokenBucket(rate_bytes_s=1_000_000, burst=10_000)
    sent = []

    async def sender():
        for _ in range(20):
            await bucket.take(50_000)
            sent.append(trio.current_time())

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        nursery.start_soon(sender)
    elapsed = trio.current_time() - start
    # 2 MB at 1 MB/s, less the initial burst.
    assert 1.95 <= elapsed <= 2.05


async def test_uncapped_bucket_never_waits(autojump_clock):
    bucket = TokenBucket(rate_bytes_s=0)
    start = trio.current_time()
    for _ in range(100):
        await bucket.take(10**9)
    assert trio.current_time() == start


async def test_a_peer_refused_again_and_again_is_read_ever_more_slowly_up_to_the_cap(autojump_clock):
    pace = RefusalPace(pause_s=0.025, max_pause_s=0.5)
    start, reads = trio.current_time(), []
    for _ in range(8):
        await pace.wait("leecher")
        reads.append(round(trio.current_time() - start, 3))
        pace.refused("leecher")
    # 25 ms doubled at each refusal in a row, then 0.5 s apart.
    assert reads == [0.0, 0.025, 0.075, 0.175, 0.375, 0.775, 1.275, 1.775]
    # Another peer is read at once, whatever this one did.
    before = trio.current_time()
    await pace.wait("honest")
    assert trio.current_time() == before


async def test_refusals_on_several_streams_of_one_peer_queue_behind_each_other(autojump_clock):
    pace = RefusalPace(pause_s=0.1, max_pause_s=0.1)
    start, reads = trio.current_time(), []

    async def lane() -> None:
        for _ in range(5):
            await pace.wait("leecher")
            reads.append(trio.current_time() - start)
            pace.refused("leecher")

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(lane)
    # Four lanes get no more than one: 20 refusals in ~2 s, not four times as many.
    assert len(reads) == 20
    assert max(reads) >= 1.5


async def test_a_peer_that_keeps_away_starts_again_from_the_first_pause(autojump_clock):
    pace = RefusalPace(pause_s=0.025, max_pause_s=0.5)
    for _ in range(6):
        await pace.wait("node")
        pace.refused("node")
    await trio.sleep(2.0)  # an honest downloader resting this peer after its busy answers
    pace.refused("node")
    before = trio.current_time()
    await pace.wait("node")
    assert trio.current_time() - before == pytest.approx(0.025)
    # Its table is bounded: past max_peers it forgets them all.
    small = RefusalPace(pause_s=1.0, max_pause_s=1.0, max_peers=3)
    for peer in "abcd":
        small.refused(peer)
    before = trio.current_time()
    await small.wait("a")  # forgotten when "d" came
    assert trio.current_time() == before
