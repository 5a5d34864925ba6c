"""Uploads favour peers that pass chunks on: a leecher gets no more than its share.

The pure parts (``reciprocity.Standing``, the free riders' admission in
``uploads.UploadPolicy``) on their own, then real engines over loopback: a
relay holding a version, two honest nodes fetching it from it, and a leecher
that announces an empty Have and pulls every chunk as fast as it can.
"""

import itertools

import trio
from libp2p.peer.peerinfo import PeerInfo

from protocol.broadcast import bitfield
from protocol.broadcast.engine import BroadcastEngine
from protocol.broadcast.reciprocity import Standing
from protocol.broadcast.settings import BroadcastConfig
from protocol.broadcast.store import VersionStore
from protocol.broadcast.uploads import UploadPolicy
from protocol.identity import Identity
from protocol.manifest import manifest_digest
from protocol.net.swarm import open_swarm
from protocol.wire import chunk, have
from protocol.wire.chunk import ChunkData, ChunkRequest
from protocol.wire.have import Have
from tests.protocol.samples import LEARNER, patterned_version

JOB = "reverse-test"
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
CHUNK = 64 * 1024
N_CHUNKS = 16


def empty_have(m) -> Have:
    return Have(JOB, m.version, manifest_digest(m), bitfield.encode((), len(m.chunk_hashes)))


def test_a_peer_that_names_no_chunk_rides_free_after_its_initial_credit():
    s = Standing(initial_credit_chunks=2, credit_s=60)
    m, _ = patterned_version(JOB, chunk_size=CHUNK, n_chunks=4)
    s.note_have("newcomer", empty_have(m), now=0)
    for _ in range(2):
        assert not s.free_rider("newcomer", 0, neighbour=True, banned=False)  # it must get started
        s.note_sent("newcomer", 0)
    assert s.free_rider("newcomer", 0, neighbour=True, banned=False)
    relay = Have(JOB, 1, manifest_digest(m), bitfield.encode({0}, 4))
    s.note_have("newcomer", relay, now=1)  # it passes chunks on now
    assert not s.free_rider("newcomer", 1, neighbour=True, banned=False)
    s.note_have("newcomer", empty_have(m), now=2)  # a new version: it held chunks until now
    assert not s.free_rider("newcomer", 61, neighbour=True, banned=False)
    assert s.free_rider("newcomer", 63, neighbour=True, banned=False)  # credit_s after its last
    assert s.free_rider("stranger", 0, neighbour=False, banned=False)  # honest peers ask neighbours
    s.note_served_us("banned", 0)
    assert s.free_rider("banned", 0, neighbour=True, banned=True)


def test_the_seed_serves_a_peer_that_never_works_one_version_then_as_a_free_rider():
    s = Standing(initial_credit_chunks=2, credit_s=60)
    m, _ = patterned_version(JOB, chunk_size=CHUNK, n_chunks=4)
    relaying = Have(JOB, m.version, manifest_digest(m), bitfield.encode({0, 1, 2, 3}, 4))
    for peer in ("idle", "worker"):
        s.note_have(peer, relaying, now=0)  # both pass chunks on
    for _ in range(4):  # a version's worth: a newcomer's first fetch, before it asks for work
        assert not s.free_rider("idle", 0, neighbour=True, banned=False, idle_credit=4)
        s.note_sent("idle", 0, works=False)
    # Then it is a free rider however it relays, while it works for nobody.
    assert s.free_rider("idle", 0, neighbour=True, banned=False, idle_credit=4)
    # Once it asks for work the seed passes no idle credit: it relays, so it is served.
    assert not s.free_rider("idle", 0, neighbour=True, banned=False)
    for _ in range(8):  # a worker's chunks spend no idle credit
        s.note_sent("worker", 0)
    assert not s.free_rider("worker", 0, neighbour=True, banned=False, idle_credit=4)


def test_free_riders_are_admitted_one_requesters_worth():
    p = UploadPolicy(n_chunks=8, max_admitted=6, is_seed=False, max_free_admitted=2)
    assert [p.allow(i, f"L{i}", free=True) for i in range(3)] == ["ok", "ok", "busy"]
    assert p.allow(3, "honest") == "ok"  # the rest stays free for peers that redistribute
    p.finished(0, ok=True, free=True)
    assert p.allow(4, "L9", free=True) == "ok"


def test_the_seeds_copy_to_a_peer_that_works_for_nobody_is_not_the_rounds_copy():
    """A leecher under a fresh identity every 5 s took each new version's
    first copies with its newcomer's credit, and the seed told the honest
    nodes to fetch them elsewhere while no honest peer held them."""
    p = UploadPolicy(n_chunks=2, max_admitted=8, is_seed=True)
    assert p.allow(0, "newcomer", counted=False) == "ok"
    assert p.offered() == {0, 1}  # still offered to the nodes
    p.finished(0, ok=True, counted=False)
    assert p.allow(0, "node") == "ok"  # the round's copy, not ask_others
    assert p.offered() == {1}
    p.finished(0, ok=True)
    assert p.allow(0, "other node") == "ask_others"  # the swarm relays it now
    assert p.allow(0, "newcomer", counted=False) == "ask_others"  # a newcomer too, unless it asks again


class Tally:
    """Bytes a leecher received; ``flowing`` is set once it has a few chunks."""

    def __init__(self):
        self.bytes = 0
        self.flowing = trio.Event()

    def add(self, n: int) -> None:
        self.bytes += n
        if self.bytes >= 4 * CHUNK:
            self.flowing.set()


async def leech(swarm, relay: PeerInfo, m, lanes: int, got: Tally, refusals: list | None = None) -> None:
    """An empty Have to ``relay``, then every chunk of ``m`` over and over on
    ``lanes`` streams (each refusal's code to ``refusals``)."""
    await swarm.host.connect(relay)
    stream = await swarm.host.new_stream(relay.peer_id, [have.PROTOCOL])
    await have.send(stream, empty_have(m))

    async def drain() -> None:  # yamux resets a stream nobody reads
        while True:
            await have.receive(stream)

    async def pull() -> None:
        lane = await swarm.host.new_stream(relay.peer_id, [chunk.PROTOCOL])
        for idx in itertools.cycle(range(N_CHUNKS)):
            reply = await chunk.ask_chunk(lane, ChunkRequest(JOB, m.version, idx, ""))
            if isinstance(reply, ChunkData):
                got.add(len(reply.data))
            else:
                if refusals is not None:
                    refusals.append(reply.code)
                await trio.sleep(0.02)  # busy: ask again soon (an eager leecher)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        for _ in range(lanes):
            nursery.start_soon(pull)


async def first_chunk(engines, version: int) -> None:
    """Return once any of ``engines`` holds a chunk of ``version``."""
    async with trio.open_nursery() as nursery:

        async def watch(engine) -> None:
            while not engine.store.chunks_held(version):
                await engine.wait_progress()
            nursery.cancel_scope.cancel()

        for engine in engines:
            nursery.start_soon(watch, engine)


def holding(root, m, chunks) -> VersionStore:
    """A store at ``root`` that holds every chunk of ``m``."""
    store = VersionStore(root, learner_id=LEARNER.peer_id_str, keep=2)
    store.add_manifest(m)
    for idx, data in enumerate(chunks):
        store.save_chunk(m, idx, data)
        store.mark_held(m.version, idx)
    return store


async def test_a_leecher_with_an_empty_have_waits_while_honest_nodes_download(tmp_path):
    m, chunks = patterned_version(JOB, chunk_size=CHUNK, n_chunks=N_CHUNKS)
    relay_store = holding(tmp_path / "relay", m, chunks)
    # 8 Mbit/s: each honest node needs 1 MiB of it, about a second alone.
    capped = BroadcastConfig(max_upload_mbit=8, discover_interval_s=60)
    got = Tally()
    async with (
        open_swarm(Identity.generate(), LOOPBACK, server=True) as relay_swarm,
        open_swarm(Identity.generate(), LOOPBACK, server=True) as a,
        open_swarm(Identity.generate(), LOOPBACK, server=True) as b,
        open_swarm(Identity.generate(), LOOPBACK, server=True) as leecher,
        trio.open_nursery() as nursery,
    ):
        relay = BroadcastEngine(
            relay_swarm, relay_store, job_id=JOB, learner_id=LEARNER.peer_id_str, is_seed=False, config=capped
        )
        await nursery.start(relay.run)
        at = PeerInfo(relay_swarm.host.get_id(), relay_swarm.host.get_addrs())
        nursery.start_soon(leech, leecher, at, m, 6, got)
        with trio.fail_after(30):
            await got.flowing.wait()  # the leecher has the uplink to itself, then honest nodes come
        honest = []
        for i, swarm in enumerate((a, b)):
            store = VersionStore(tmp_path / f"honest{i}", learner_id=LEARNER.peer_id_str, keep=2)
            engine = BroadcastEngine(swarm, store, job_id=JOB, learner_id=LEARNER.peer_id_str, is_seed=False)
            await nursery.start(engine.run)
            nursery.start_soon(engine.connect, at)
            honest.append(engine)
        with trio.move_on_after(30) as waited:  # from their first chunk: the share while they wait
            await first_chunk(honest, m.version)
        assert not waited.cancelled_caught, "no honest node got a chunk in 30 s: the leecher held the uplink"
        before, started = got.bytes, trio.current_time()
        with trio.move_on_after(30) as waited:
            for engine in honest:
                await engine.wait_newer(-1)
        assert not waited.cancelled_caught, "the honest nodes did not get the version in 30 s"
        leeched, elapsed = got.bytes - before, trio.current_time() - started
        nursery.cancel_scope.cancel()
    me = relay_swarm.host.get_id().to_base58()
    shares = [e.stats.bytes_from[me] for e in honest]
    assert shares == [N_CHUNKS * CHUNK] * 2
    # While the honest nodes download, the leecher gets only the chunks that
    # were under way when they came (it took 2 MiB of their 4 s before free
    # riders waited for an idle uplink; now the download takes what it takes
    # alone, 2 MiB at 8 Mbit/s).
    assert leeched <= capped.free_rider_admitted * CHUNK, (leeched, elapsed, shares)
    assert relay.stats.free_rider_bytes_up >= leeched - 2 * CHUNK  # counted as free riding


async def test_a_leecher_looping_refused_requests_is_answered_at_a_pace(tmp_path):
    """Six lanes asking again 20 ms after each ``busy``: unpaced, the relay
    answered ~200 refusals a second; paced (``ratelimit.RefusalPace``), a
    few quick ones, then two a second for the peer over all its lanes."""
    m, chunks = patterned_version(JOB, chunk_size=CHUNK, n_chunks=N_CHUNKS)
    relay_store = holding(tmp_path / "relay", m, chunks)
    got, refusals = Tally(), []
    async with (
        open_swarm(Identity.generate(), LOOPBACK, server=True) as relay_swarm,
        open_swarm(Identity.generate(), LOOPBACK, server=True) as leecher,
        trio.open_nursery() as nursery,
    ):
        relay = BroadcastEngine(relay_swarm, relay_store, job_id=JOB, learner_id=LEARNER.peer_id_str, is_seed=False)
        await nursery.start(relay.run)
        at = PeerInfo(relay_swarm.host.get_id(), relay_swarm.host.get_addrs())
        nursery.start_soon(leech, leecher, at, m, 6, got, refusals)
        with trio.fail_after(30):
            await got.flowing.wait()  # a free rider by now: two lanes served, four answered busy
        before = len(refusals)
        await trio.sleep(3.0)
        window = len(refusals) - before
        nursery.cancel_scope.cancel()
    pace = relay.server.refusals
    # At most max_pause_s apart once paced (0.5 s), plus the ramp (<= 6 quick
    # ones) each time the peer kept away on its own: well under 20 in 3 s.
    assert 1 <= window <= 20, (window, pace.pause_s, pace.max_pause_s)
    assert got.bytes > 4 * CHUNK  # still served within the free riders' share
