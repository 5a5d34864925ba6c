"""A node keeps where its learner is: a connection that drops long after
joining is redialled at once, over real Noise hosts on loopback."""

from types import SimpleNamespace

import trio
from libp2p.peer import peerdata
from libp2p.peer.peerinfo import info_from_p2p_addr

from echo_node.learner_lookup import pin_learner
from protocol import framing
from protocol.identity import Identity
from protocol.messages import ErrorReply
from protocol.net.host import full_addrs, make_host, parse_multiaddr

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
HOURS_LATER = 3 * 3600  # past every time-to-live py-libp2p gives addresses (2 min to 2 h)


async def _drop_and_redial(learner, node, learner_info, monkeypatch, *, pin: bool) -> ErrorReply:
    await node.connect(learner_info)  # what the lookup does: py-libp2p keeps the addresses 2 minutes
    with trio.fail_after(10):
        while not learner.get_network().connections.get(node.get_id()):
            await trio.sleep(0.01)
    later = peerdata.time.time() + HOURS_LATER
    monkeypatch.setattr(peerdata, "time", SimpleNamespace(time=lambda: later))
    # The learner closes the node's connection, as py-libp2p does when a
    # second connection under the node's peer id arrives.
    for conn in list(learner.get_network().connections[node.get_id()]):
        await conn.close()
    with trio.fail_after(10):
        while node.get_network().connections.get(learner_info.peer_id):
            await trio.sleep(0.01)
    if pin:
        pin_learner(node, learner_info.peer_id, learner_info.addrs)
    with trio.fail_after(10):
        stream = await node.new_stream(learner_info.peer_id, ["/test/1"])
        return await framing.receive(stream, ErrorReply)


def _learner():
    host = make_host(Identity.generate(), [LOOPBACK])

    async def handler(stream):
        await framing.send(stream, ErrorReply("hello", "still here"))
        await stream.close()

    host.set_stream_handler("/test/1", handler)
    return host


async def _run(monkeypatch, *, pin: bool) -> ErrorReply | Exception:
    """The reply after the drop, or what the redial raised."""
    learner, node = _learner(), make_host(Identity.generate(), [LOOPBACK])
    addr = parse_multiaddr(LOOPBACK)
    async with learner.run([addr]), node.run([addr]):
        info = info_from_p2p_addr(parse_multiaddr(full_addrs(learner)[0]))
        try:
            return await _drop_and_redial(learner, node, info, monkeypatch, pin=pin)
        except Exception as exc:  # py-libp2p's dial errors share no base class
            return exc


async def test_left_to_py_libp2p_the_learners_addresses_are_forgotten(monkeypatch):
    """Why the node pins them."""
    failure = await _run(monkeypatch, pin=False)
    assert isinstance(failure, Exception) and "No known addresses" in str(failure), failure


async def test_a_pinned_learner_is_redialled_at_once_hours_after_joining(monkeypatch):
    reply = await _run(monkeypatch, pin=True)
    assert isinstance(reply, ErrorReply) and reply.message == "still here", reply
