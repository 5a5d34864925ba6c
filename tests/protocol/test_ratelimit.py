import trio

from protocol.broadcast.ratelimit import TokenBucket


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
