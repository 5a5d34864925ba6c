"""What the broadcast engine's parts share: one record per engine.

The engine (``protocol.broadcast.engine``) owns it; its parts read and change
it: the have-streams (``have_streams``: ``neighbours``, ``relayed``), version
following (``following``: ``queued``) and the download loop (``downloads``:
``target``, ``download``, ``trusted``). The events wake whoever waits on a
change: a have-writer (``have_changed``), a caller of ``wait_newer`` or
``wait_progress`` (``poke_local``), the download loop (``poke_downloader``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio
from libp2p.host.exceptions import HostException
from libp2p.network.exceptions import SwarmException
from libp2p.network.stream.exceptions import StreamError

from protocol.broadcast.records import PeerRecords
from protocol.broadcast.scheduler import Download
from protocol.broadcast.settings import BroadcastConfig, Stats
from protocol.broadcast.store import VersionStore
from protocol.errors import ProtocolError
from protocol.messages import Manifest
from protocol.net.swarm import Swarm
from protocol.rpc import RequestFailed
from protocol.wire.have import Have

# Errors a request to a peer can end with when the peer misbehaves or vanishes
# mid-dial (py-libp2p's errors share no base class below Exception); none may
# stop the engine. Anything else is a bug.
PEER_ERRORS = (ProtocolError, StreamError, SwarmException, HostException, RequestFailed, OSError)


@dataclass(eq=False)
class EngineState:
    swarm: Swarm
    store: VersionStore
    job_id: str
    learner_id: str
    is_seed: bool
    config: BroadcastConfig
    stats: Stats = field(default_factory=Stats)
    # Each neighbour's latest Have (None while its have-stream opens).
    neighbours: dict[str, Have | None] = field(default_factory=dict)
    relayed: set[str] = field(default_factory=set)  # neighbours reached only through a relay
    # Peers that have sent us a good chunk: asked first, and given a second
    # chance after a stall.
    trusted: set[str] = field(default_factory=set)
    # Each peer's record over every version (good chunks: ``stats.chunks_from``;
    # failed requests), built in __post_init__.
    records: PeerRecords = field(init=False)
    target: Manifest | None = None  # the version downloaded (the seed: published) now
    queued: Manifest | None = None  # the newest version, once the current one is done
    download: Download | None = None  # of ``target``
    local_changed: trio.Event = field(default_factory=trio.Event)
    progress: trio.Event = field(default_factory=trio.Event)
    wake_downloader: trio.Event = field(default_factory=trio.Event)

    def __post_init__(self) -> None:
        self.records = PeerRecords(served=self.stats.chunks_from)

    @property
    def me(self) -> str:
        return self.swarm.host.get_id().to_base58()

    def newest_wanted(self) -> Manifest | None:
        return self.queued if self.queued is not None else self.target

    def have_changed(self) -> None:
        """What we announce changed (chunks held, or the seed's offer): have-writers send."""
        self.local_changed.set()
        self.local_changed = trio.Event()

    def poke_local(self) -> None:
        """Our holdings changed: have-writers send, waiters re-check."""
        self.have_changed()
        self.progress.set()
        self.progress = trio.Event()
        self.poke_downloader()

    def poke_downloader(self) -> None:
        self.wake_downloader.set()
        self.wake_downloader = trio.Event()
