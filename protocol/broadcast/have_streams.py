"""Have-streams: one per neighbour, both ways (``/echo-swarm/have/1.1.0``).

Both sides send a ``Have`` (version, manifest digest, bitfield, base held)
whenever theirs changes, and read the other's continuously (yamux resets a
stream whose reader stalls for 5 s). A process dials neighbours up to
``max_neighbours`` and accepts up to ``max_accepted``; what a neighbour's
Have means, and what its leaving undoes, is the engine's (``on_have``,
``on_gone``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio
from libp2p.abc import INetStream
from libp2p.peer.peerinfo import PeerInfo

from protocol.broadcast.requests import discard
from protocol.broadcast.state import PEER_ERRORS, EngineState
from protocol.errors import ProtocolError
from protocol.net.dial import DialFailed, is_relayed
from protocol.net.swarm import reach
from protocol.process.logs import event
from protocol.rpc import remote_peer, route
from protocol.wire import have
from protocol.wire.have import Have

log = logging.getLogger(__name__)


class HaveStreams:
    def __init__(
        self,
        state: EngineState,
        *,
        my_have: Callable[[], Have],
        on_have: Callable[[str, Have], None],
        on_gone: Callable[[str], Awaitable[None]],
        max_neighbours: int,
        max_accepted: int,
    ):
        """``my_have()``: what we announce now; ``on_have(peer, have)``: each
        Have a neighbour sends; ``on_gone(peer)``: a neighbour's stream ended."""
        self.state = state
        self.my_have = my_have
        self.on_have = on_have
        self.on_gone = on_gone
        self.max_neighbours = max_neighbours
        self.max_accepted = max_accepted

    async def accept(self, stream: INetStream) -> None:
        """The handler of a have-stream a peer opens."""
        peer = remote_peer(stream)
        neighbours = self.state.neighbours
        if peer in neighbours or len(neighbours) >= self.max_accepted:
            await stream.close()
            return
        neighbours[peer] = None
        await self._run(peer, stream)

    async def connect(self, info: PeerInfo) -> None:
        """Dial ``info`` and open a have-stream, unless one is already open."""
        s = self.state
        peer = info.peer_id.to_base58()
        if peer == s.me or peer in s.neighbours:
            return
        if len(s.neighbours) >= self.max_neighbours or self._waits_to_be_dialled(info):
            return
        s.neighbours[peer] = None  # reserve: no second dial while this one runs
        event(log, logging.DEBUG, "dialling peer", peer=peer, addrs=[str(a) for a in info.addrs])
        try:
            with trio.fail_after(s.config.request_timeout_s):
                if info.addrs:
                    how = await reach(s.swarm, info, s.config.request_timeout_s)
                    event(log, logging.DEBUG, "connected to peer", peer=peer, route=how)
                stream = await s.swarm.host.new_stream(info.peer_id, [have.PROTOCOL])
        except (trio.TooSlowError, DialFailed, *PEER_ERRORS) as exc:
            s.neighbours.pop(peer, None)
            event(log, logging.DEBUG, "could not reach peer", peer=peer, error=exc)
            return
        await self._run(peer, stream)

    def _waits_to_be_dialled(self, info: PeerInfo) -> bool:
        """Two peers behind NAT that dial each other at once through the relay
        start two hole punches that collide (each side's SYN leaves from the
        same port); so between two such peers, only the smaller id dials."""
        relay = self.state.swarm.relay
        both_natted = any(is_relayed(a) for a in info.addrs) and relay is not None and bool(relay.advertised)
        return both_natted and self.state.me > info.peer_id.to_base58()

    async def _run(self, peer: str, stream: INetStream) -> None:
        s = self.state
        if route(stream.muxed_conn) != "direct":
            s.relayed.add(peer)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, stream)
                await self._reader(peer, stream)
                nursery.cancel_scope.cancel()
        except* PEER_ERRORS as group:
            event(log, logging.DEBUG, "have-stream ended", peer=peer, error=group.exceptions[0])
        finally:
            s.neighbours.pop(peer, None)
            s.relayed.discard(peer)
            await self.on_gone(peer)
            await discard(stream)

    async def _writer(self, stream: INetStream) -> None:
        last = None
        while True:
            changed = self.state.local_changed
            mine = self.my_have()
            if mine != last:
                await have.send(stream, mine)
                last = mine
                # Coalesce: chunks that arrive meanwhile go out in one Have.
                await trio.sleep(self.state.config.have_interval_s)
                continue
            await changed.wait()

    async def _reader(self, peer: str, stream: INetStream) -> None:
        while True:
            theirs = await have.receive(stream)
            if theirs.job_id != self.state.job_id:
                raise ProtocolError(f"have for job {theirs.job_id}")
            self.state.neighbours[peer] = theirs
            self.on_have(peer, theirs)
