"""What our hosts answer on libp2p's identify protocol (``/ipfs/id/1.0.0``).

py-libp2p 0.8.1 answers with the protocolVersion ``ipfs/0.1.0``, hard-coded.
rust-libp2p's Kademlia as lattica runs it (lattica 1.0.21 on PyPI) drops a
peer whose protocolVersion differs from its own, and lattica uses that one
value for two things: its identify protocolVersion and the stream protocol
id of its Kademlia. So the one value a lattica peer can share with us and
still speak Kademlia to our DHT is the Kademlia protocol id itself,
``/ipfs/kad/1.0.0`` (rust-libp2p requires it to start with ``/``). With
``/echo-swarm/1.0.0`` (our first try) a lattica peer kept the connection
but proposed Kademlia on ``/echo-swarm/1.0.0``, which nobody serves.
(tests/protocol/test_rust_peer.py runs a real lattica peer against ours.)

Our hosts answer with ``PROTOCOL_VERSION`` through a handler of their own
(py-libp2p is not patched); everything else in the answer is py-libp2p's
own. go-libp2p and plain rust-libp2p keep peers whatever they say here.
Identify pushes (sent when a host's listen addresses change) still carry
py-libp2p's value: they are built inside py-libp2p's host.
"""

from __future__ import annotations

import logging

from libp2p.abc import IHost, INetStream
from libp2p.identity.identify import identify as py_identify
from libp2p.kad_dht.common import PROTOCOL_ID as KAD_PROTOCOL_ID
from libp2p.network.stream.exceptions import StreamClosed, StreamReset
from libp2p.stream_muxer.exceptions import MuxedStreamError
from libp2p.utils.varint import encode_varint_prefixed

log = logging.getLogger(__name__)

# The Kademlia protocol our DHT speaks (see the module's docstring).
PROTOCOL_VERSION = KAD_PROTOCOL_ID
PROTOCOL = py_identify.ID


def install(host: IHost) -> None:
    """Answer identify on ``host`` with our ``PROTOCOL_VERSION``."""
    host.set_stream_handler(PROTOCOL, _handler_for(host))


def _handler_for(host: IHost):  # type: ignore[no-untyped-def]
    async def handle(stream: INetStream) -> None:
        try:
            message = py_identify._mk_identify_protobuf(host, _observed(host, stream))
            message.protocol_version = PROTOCOL_VERSION
            await stream.write(encode_varint_prefixed(message.SerializeToString()))
        except (StreamClosed, StreamReset, MuxedStreamError):
            log.debug("identify: the stream closed before our answer")
        finally:
            try:
                await stream.close()
            except Exception:  # closing a reset stream: nothing left to do
                pass

    return handle


def _observed(host: IHost, stream: INetStream):  # type: ignore[no-untyped-def]
    """The address we see the peer at, as py-libp2p's own handler reports it
    (a relayed peer's circuit address rather than the relay's)."""
    try:
        remote = stream.get_remote_address()
    except Exception:
        return None
    if not remote:
        return None
    observed = py_identify._remote_address_to_multiaddr(remote)
    return py_identify._prefer_circuit_addr(host, stream.muxed_conn.peer_id, observed)
