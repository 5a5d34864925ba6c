"""Who redistributes: the standing an uploader gives each requester. Pure logic, no I/O.

Uploads favour peers that upload in turn (BitTorrent's tit-for-tat, and its
optimistic unchoke for newcomers). A requester *redistributes* when, within
``credit_s``, its Have named a chunk (so others can fetch from it) or it sent
us a good chunk; a neighbour that has done neither still counts as one for its
first ``initial_credit_chunks`` chunks, since a newcomer holds nothing yet and
must get started. Everyone else is a *free rider*: a peer that announces an
empty Have and downloads everything, a peer that is not our neighbour (honest
peers only ask neighbours whose Have they read), or one our downloads banned.
Free riders are served only within a share: a few at a time
(``uploads.UploadPolicy``), paced by a bucket of their own and holding no
upload slot (``serving``), so peers that pass chunks on never wait for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.wire.have import Have

# Peers remembered per table (then forgotten at once): what a forgotten peer
# loses is its standing, which it regains at its next Have naming a chunk.
MAX_REMEMBERED = 4096


def names_chunks(have: Have) -> bool:
    """Does ``have`` announce anything another peer could fetch: a chunk of its
    version, or a base held in full?"""
    return bool(have.base_digest) or any(have.bitfield)


@dataclass
class Standing:
    """What this process knows of each requester's redistribution.

    ``initial_credit_chunks``: chunks served to a neighbour that has not yet
    redistributed before it counts as a free rider; ``credit_s``: how long an
    announcement or a chunk it sent us keeps a peer's standing.
    """

    initial_credit_chunks: int
    credit_s: float
    _naming: set[str] = field(default_factory=set)  # neighbours whose latest Have names chunks
    _gave_at: dict[str, float] = field(default_factory=dict)  # peer -> when it last named or sent a chunk
    _sent: dict[str, int] = field(default_factory=dict)  # peer -> chunks we sent it while it had no standing
    _sent_idle: dict[str, int] = field(default_factory=dict)  # the seed: peer -> chunks sent it while it did not work

    def note_have(self, peer: str, have: Have, now: float) -> None:
        """``peer``'s latest Have. One naming chunks gives standing while it is
        the latest; the standing lasts ``credit_s`` past it, so that a peer that
        starts a new version (its Have then names nothing for a while) keeps it."""
        if names_chunks(have) or peer in self._naming:
            self._renew(peer, now)
        if names_chunks(have):
            if len(self._naming) >= MAX_REMEMBERED:
                self._naming.clear()
            self._naming.add(peer)
        else:
            self._naming.discard(peer)

    def forget(self, peer: str, now: float) -> None:
        """``peer``'s have-stream ended: its last Have is no longer current."""
        if peer in self._naming:
            self._naming.discard(peer)
            self._renew(peer, now)

    def note_served_us(self, peer: str, now: float) -> None:
        """``peer`` sent us a good chunk."""
        self._renew(peer, now)

    def note_sent(self, peer: str, now: float, *, works: bool = True) -> None:
        """We sent ``peer`` a chunk: spends its initial credit unless it
        redistributes, and the seed's idle credit (``free_rider``) unless it
        ``works`` for the job."""
        if not works:
            _count(self._sent_idle, peer)
        if not self._redistributes(peer, now):
            _count(self._sent, peer)

    def free_rider(
        self, peer: str, now: float, *, neighbour: bool, banned: bool, idle_credit: int | None = None
    ) -> bool:
        """Is ``peer`` to be served only within the free riders' share?

        ``idle_credit``: the seed's, for a peer that does not work for the job
        (it never asked for work): the chunks it is sent before it is a free
        rider, however it redistributes. One version's worth lets a newcomer
        fetch its first version (a node asks for work once it holds one); a
        peer that then fetches every version and works for nobody took the
        seed's first copies and its CPU from the nodes (four that sent each
        node one good chunk and then trickled: issue 55)."""
        if banned or not neighbour:
            return True
        if idle_credit is not None and self._sent_idle.get(peer, 0) >= idle_credit:
            return True
        if self._redistributes(peer, now):
            return False
        return self._sent.get(peer, 0) >= self.initial_credit_chunks

    def _redistributes(self, peer: str, now: float) -> bool:
        at = self._gave_at.get(peer)
        return peer in self._naming or at is not None and now - at <= self.credit_s

    def _renew(self, peer: str, now: float) -> None:
        if len(self._gave_at) >= MAX_REMEMBERED and peer not in self._gave_at:
            self._gave_at.clear()
        self._gave_at[peer] = now


def _count(table: dict[str, int], peer: str) -> None:
    """One more for ``peer`` in a table of at most ``MAX_REMEMBERED`` peers."""
    if len(table) >= MAX_REMEMBERED and peer not in table:
        table.clear()
    table[peer] = table.get(peer, 0) + 1
