"""Each stream protocol, both ends, over in-memory streams (no libp2p)."""

from pathlib import Path

import pytest
import trio

from protocol import codec
from protocol.errors import DecodeError, StreamClosed
from protocol.messages import ErrorReply, Manifest
from protocol.wire import chunk, have, receipts, rollout, work
from protocol.wire.chunk import ChunkData, ChunkRequest, ManifestRequest
from protocol.wire.have import Have
from protocol.wire.receipts import ReceiptPage, ReceiptQuery
from protocol.wire.work import NoWork, WorkRequest

from .samples import all_messages, batch
from .test_framing import pair

SAMPLES = {type(m): m for m in all_messages()}


async def exchange(client, handler):
    """Run ``handler`` on one end of a fresh stream and ``client`` on the other;
    return what the client got."""
    ours, theirs = pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler, theirs)
        return await client(ours)


async def test_work_request_gets_what_the_handler_decides():
    asked = []

    async def respond(req: WorkRequest):
        asked.append(req)
        return SAMPLES[NoWork] if req.max_prompts > 8 else ErrorReply(work.TOO_MANY_REQUESTS, "slow down")

    req = SAMPLES[WorkRequest]
    reply = await exchange(lambda s: work.ask(s, req), lambda s: work.answer(s, respond))
    assert asked == [req]
    assert reply == ErrorReply(work.TOO_MANY_REQUESTS, "slow down")


async def test_work_handler_refuses_a_request_of_another_kind_unanswered():
    ours, theirs = pair()
    called = []

    async def respond(req):
        called.append(req)
        return SAMPLES[NoWork]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(rollout.submit, ours, batch())  # a batch on a work stream
        with pytest.raises(DecodeError, match="unexpected message kind"):
            await work.answer(theirs, respond)
        nursery.cancel_scope.cancel()
    assert called == []


async def test_a_batch_gets_its_receipt():
    judged = []

    async def judge(b, frame):
        judged.append((b, frame))
        return SAMPLES[rollout.Receipt]

    reply = await exchange(lambda s: rollout.submit(s, batch()), lambda s: rollout.answer(s, judge, pytest.fail))
    # The judge gets the batch and the frame it came in, byte for byte.
    assert judged == [(batch(), codec.encode(batch()))]
    assert reply == SAMPLES[rollout.Receipt]


async def test_a_malformed_batch_is_reported_and_answered_malformed():
    ours, theirs = pair()
    malformed = []

    async def client(stream):
        await stream.write((64).to_bytes(4, "big") + b"\xc1" * 64)  # not msgpack
        return await stream.read(4096)

    async def judge(b, frame):
        raise AssertionError("a malformed batch is never judged")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(rollout.answer, theirs, judge, malformed.append)
        raw = await client(ours)
    assert len(malformed) == 1 and isinstance(malformed[0], DecodeError)
    assert b"malformed" in raw


async def test_a_batch_cut_mid_frame_is_no_submission():
    ours, theirs = pair()
    malformed = []
    await ours.write((1000).to_bytes(4, "big") + b"x" * 10)
    await ours.close()
    with pytest.raises(StreamClosed):
        await rollout.answer(theirs, pytest.fail, malformed.append)
    assert malformed == []


async def test_receipts_query_gets_a_page():
    async def respond(query: ReceiptQuery):
        return ReceiptPage(query.job_id, (), query.after_id, False)

    query = ReceiptQuery("reverse-test", 41, receipts.MAX_PER_PAGE)
    page = await exchange(lambda s: receipts.ask(s, query), lambda s: receipts.answer(s, respond))
    assert page == ReceiptPage("reverse-test", (), 41, False)


async def test_one_chunk_stream_carries_many_requests_until_the_client_closes_it():
    manifest = SAMPLES[Manifest]
    ours, theirs = pair()
    served = []

    async def handler(stream):
        while (req := await chunk.next_request(stream)) is not None:
            served.append(req)
            if isinstance(req, ManifestRequest):
                await chunk.send_reply(stream, manifest)
            elif req.index == 5:
                await chunk.send_reply(stream, ErrorReply(chunk.BUSY, "later"))
            else:
                payload = ChunkData(req.job_id, req.version, req.index, bytes([req.index]) * 100_000)

                async def before_piece(n):
                    await trio.lowlevel.checkpoint()

                await chunk.send_chunk(stream, payload, piece_bytes=16_384, before_piece=before_piece)

    progress = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler, theirs)
        assert await chunk.ask_manifest(ours, ManifestRequest("reverse-test", -1)) == manifest
        got = await chunk.ask_chunk(ours, ChunkRequest("reverse-test", 1, 2), progress.append)
        assert got == ChunkData("reverse-test", 1, 2, b"\x02" * 100_000)
        assert sum(progress) > 100_000  # the frame, counted as it arrived
        assert await chunk.ask_chunk(ours, ChunkRequest("reverse-test", 1, 5)) == ErrorReply(chunk.BUSY, "later")
        await ours.close()
    assert [type(r) for r in served] == [ManifestRequest, ChunkRequest, ChunkRequest]


async def test_have_messages_flow_both_ways():
    a, b = pair()
    mine, theirs = SAMPLES[Have], Have("reverse-test", 2, b"e" * 32, b"\xff\x01")
    await have.send(a, mine)
    await have.send(b, theirs)
    assert await have.receive(b) == mine
    assert await have.receive(a) == theirs
    await a.close()
    with pytest.raises(StreamClosed):
        await have.receive(b)


def _size(n: int) -> str:
    """A frame limit as docs/protocol.md writes it: 1 KiB, 8 MiB, 4 MiB + 1 KiB."""
    mib, rest = divmod(n, 2**20)
    if not mib:
        return f"{n // 1024} KiB"
    return f"{mib} MiB" + (f" + {rest // 1024} KiB" if rest else "")


def test_docs_give_every_protocol_its_id_error_codes_and_frame_limits():
    text = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    for module in (work, rollout, receipts, chunk, have):
        assert f"`{module.PROTOCOL}`" in text, module.__name__
        codes = [v for k, v in vars(module).items() if k.isupper() and k != "PROTOCOL" and isinstance(v, str)]
        for code in codes:
            assert f"`{code}`" in text, (module.__name__, code)
        kinds = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]
        for kind in kinds:
            if hasattr(kind, "MAX_BYTES"):
                assert f"{kind.__name__} ({_size(kind.MAX_BYTES)})" in text, kind.__name__
    for kind in (Manifest, ErrorReply):
        assert f"{kind.__name__} ({_size(kind.MAX_BYTES)})" in text
