"""Kept streams (``protocol.rpc``): the work and rollout protocols' newer
versions carry one exchange after another on a stream; clients fall back to
one exchange per stream with a peer of the older version (real hosts on
loopback)."""

from contextlib import asynccontextmanager

import pytest
import trio
from libp2p.peer.peerinfo import PeerInfo

from protocol import framing
from protocol.identity import Identity
from protocol.messages import ErrorReply
from protocol.net.host import make_host, parse_multiaddr
from protocol.rpc import KeptStreams, request, serve, serve_kept
from protocol.wire import rollout, work
from protocol.wire.work import NoWork, WorkRequest

from .samples import all_messages, batch

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
ASK = next(m for m in all_messages() if isinstance(m, WorkRequest))


class Server:
    """A host answering work requests, counting the streams and exchanges it served."""

    def __init__(self) -> None:
        self.host = make_host(Identity.generate(), [LOOPBACK])
        self.streams = 0
        self.exchanges = 0
        self.stream_ended = trio.Event()

    async def answer(self, stream) -> None:  # type: ignore[no-untyped-def]
        async def respond(req: WorkRequest) -> NoWork:
            self.exchanges += 1
            return NoWork(req.job_id, 1, retry_after_ms=0, reason=f"answer {self.exchanges}")

        await work.answer(stream, respond)

    def serve(self, protocol: str, *, kept: bool, idle_s: float = 60.0) -> None:
        inner = serve_kept(protocol, self.answer, 10, idle_s) if kept else serve(protocol, self.answer, 10)

        async def counted(stream) -> None:  # type: ignore[no-untyped-def]
            self.streams += 1
            await inner(stream)
            self.stream_ended.set()

        self.host.set_stream_handler(protocol, counted)


@asynccontextmanager
async def connected(server: Server, client_idle_s: float = 30.0):
    client = make_host(Identity.generate(), [LOOPBACK])
    async with server.host.run([parse_multiaddr(LOOPBACK)]), client.run([parse_multiaddr(LOOPBACK)]):
        await client.connect(PeerInfo(server.host.get_id(), server.host.get_addrs()))
        yield KeptStreams(client, idle_s=client_idle_s)


async def ask(streams: KeptStreams, server: Server) -> NoWork:
    return await streams.request(server.host.get_id(), work.PROTOCOLS, lambda s: work.ask(s, ASK), timeout_s=10)


async def test_one_kept_stream_carries_request_after_request():
    server = Server()
    server.serve(work.PROTOCOL, kept=True)
    async with connected(server) as streams:
        replies = [await ask(streams, server) for _ in range(5)]
    assert [r.reason for r in replies] == [f"answer {i}" for i in range(1, 6)]
    assert (server.streams, server.exchanges) == (1, 5)
    assert (streams.opened, streams.reused) == (1, 4)


async def test_requests_at_once_take_a_stream_each_and_keep_at_most_two():
    server = Server()
    server.serve(work.PROTOCOL, kept=True)
    async with connected(server) as streams:
        for _ in range(3):  # three rounds of four requests at once
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(ask, streams, server)
    assert server.exchanges == 12
    # Four streams in the first round; two kept, so two new ones in each round after.
    assert streams.opened == 4 + 2 + 2 and server.streams == streams.opened


async def test_a_learner_of_the_older_version_gets_one_request_per_stream():
    server = Server()
    server.serve(work.PROTOCOL_1_4, kept=False)
    async with connected(server) as streams:
        replies = [await ask(streams, server) for _ in range(3)]
    assert [r.reason for r in replies] == ["answer 1", "answer 2", "answer 3"]
    assert (server.streams, streams.opened, streams.reused) == (3, 3, 0)


async def test_a_client_does_not_reuse_a_stream_idle_past_its_window():
    server = Server()
    server.serve(work.PROTOCOL, kept=True)
    async with connected(server, client_idle_s=0.2) as streams:
        await ask(streams, server)
        await trio.sleep(0.3)  # the time that passes is what is tested
        await ask(streams, server)
    assert (streams.opened, streams.reused, server.exchanges) == (2, 0, 2)


async def test_a_stream_the_server_closed_for_idleness_is_not_reused():
    server = Server()
    server.serve(work.PROTOCOL, kept=True, idle_s=0.3)
    server.serve(work.PROTOCOL_1_4, kept=False)
    async with connected(server, client_idle_s=60) as streams:
        await ask(streams, server)
        with trio.fail_after(5):
            await server.stream_ended.wait()
            # An exchange on another stream of the connection: yamux reads
            # frames in order, so the kept stream's close has arrived after it.
            await request(
                streams.host, server.host.get_id(), work.PROTOCOL_1_4, lambda s: work.ask(s, ASK), timeout_s=5
            )
            # Kept far inside the client's own window (older learners close
            # after 60 s, ours after 300), the closed stream is left for a new one.
            assert (await ask(streams, server)).reason == "answer 3"
    assert (streams.opened, streams.reused) == (2, 0)


async def test_an_oversized_batch_ends_its_kept_stream_after_its_answer():
    """The batch's bytes were not read, so nothing after them is a frame."""
    server_host = make_host(Identity.generate(), [LOOPBACK])
    malformed, judged = [], []

    async def judge(b, frame):  # type: ignore[no-untyped-def]
        judged.append(b)
        return ErrorReply("x", "never sent: the test only checks that it is called")

    async def answer(stream) -> None:  # type: ignore[no-untyped-def]
        await rollout.answer(stream, judge, malformed.append)

    server_host.set_stream_handler(rollout.PROTOCOL, serve_kept(rollout.PROTOCOL, answer, 10, 60))
    client = make_host(Identity.generate(), [LOOPBACK])
    async with server_host.run([parse_multiaddr(LOOPBACK)]), client.run([parse_multiaddr(LOOPBACK)]):
        await client.connect(PeerInfo(server_host.get_id(), server_host.get_addrs()))
        stream = await client.new_stream(server_host.get_id(), [rollout.PROTOCOL])
        too_big = rollout.RolloutBatch.MAX_BYTES + 1
        # The announced batch, then what would be a whole batch frame inside its bytes.
        await stream.write(too_big.to_bytes(4, "big"))
        with trio.fail_after(10):
            reply = await framing.receive(stream, ErrorReply)
            await framing.send(stream, batch())
            with pytest.raises(Exception):  # the server closed the stream: EOF or reset
                await framing.receive(stream, rollout.Receipt, ErrorReply)
    assert reply.code == rollout.MALFORMED and len(malformed) == 1
    assert judged == []
