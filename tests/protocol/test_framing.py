import pytest
import trio
import trio.testing

from protocol import framing
from protocol.errors import MessageTooLarge, StreamClosed
from protocol.wire.work import WorkRequest

from .samples import work_request


class MemoryStream:
    """A trio in-memory stream with py-libp2p's read/write interface."""

    def __init__(self, stream):
        self.stream = stream
        self.bytes_read = 0

    async def read(self, n=None):
        data = await self.stream.receive_some(n)
        self.bytes_read += len(data)
        return data

    async def write(self, data):
        await self.stream.send_all(data)

    async def close(self):
        await self.stream.aclose()


def pair():
    a, b = trio.testing.memory_stream_pair()
    return MemoryStream(a), MemoryStream(b)


async def test_message_round_trip():
    a, b = pair()
    msg = work_request(job_id="job")
    await framing.send(a, msg)
    assert await framing.receive(b, WorkRequest) == msg


async def test_oversized_frame_refused_before_body_is_read():
    a, b = pair()
    await a.write((10**6).to_bytes(4, "big") + b"x" * 1000)
    with pytest.raises(MessageTooLarge):
        await framing.receive(b, WorkRequest)
    assert b.bytes_read == 4  # only the header


async def test_truncated_frame_is_stream_closed():
    a, b = pair()
    await a.write((100).to_bytes(4, "big") + b"x" * 10)
    await a.close()
    with pytest.raises(StreamClosed, match="10 of 100"):
        await framing.read_frame(b, 1000)


async def test_large_frame_arrives_in_pieces():
    a, b = pair()
    payload = bytes(range(256)) * 4096  # 1 MiB; memory streams deliver it in pieces
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framing.write_frame, a, payload)
        assert await framing.read_frame(b, len(payload)) == payload
