"""Each peer's record with us over every version: the good chunks it sent us
and the requests to it that failed.

A node's ``Download`` starts afresh at each version, but a peer's conduct is
its own: one good chunk once made a peer trusted for good, so a peer that
sent one and then answered every request with a byte every 2 s (just inside
the stall timer) was asked first again at each version's start, and honest
throughput fell to 0.46 of the baseline (issue 55, ``bench/attacks.py
trickling_chunk_peers``). The engine keeps one record for all its versions;
``scheduler.Download`` reads it to order holders and to decide what goes to
the seed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# Peers whose failed requests are remembered; past that the failures are
# forgotten at once, as ``downloads.MAX_TRUSTED`` forgets the trusted, so that
# a swarm of short-lived strangers cannot grow the table.
MAX_PEERS = 4096


@dataclass
class PeerRecords:
    # Good chunks each peer has sent us (the engine passes its
    # ``Stats.chunks_from``), and requests to it that ended without their
    # chunk: it stalled, or another copy overtook it.
    served: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)

    def failed(self, peer: str) -> None:
        if peer not in self.failures and len(self.failures) >= MAX_PEERS:
            self.failures.clear()
        self.failures[peer] += 1

    def doubtful(self, peer: str) -> bool:
        """Have requests to ``peer`` failed as often as it sent us good chunks?
        (An honest peer overtaken now and then has many more good chunks.)"""
        failures = self.failures.get(peer, 0)
        return failures > 0 and failures >= self.served.get(peer, 0)

    def proven(self, peer: str, chunks: int) -> bool:
        """Has ``peer`` sent us ``chunks`` good chunks at least?"""
        return self.served.get(peer, 0) >= chunks
