"""Which peers changed since a reader last looked: how admission keeps its
view of the swarm up to date by peer rather than rescanning every peer at
each change (echo_learner/swarm/admission.py)."""

from __future__ import annotations

# A reader that stops looking must not make the set grow without end: past
# this many peers the set is dropped and the reader told to start over.
MAX_NOTED = 100_000


class Changes:
    def __init__(self) -> None:
        self._peers: set[str] = set()
        self._overflowed = True  # a first reader starts from everything

    def note(self, peer: str) -> None:
        if self._overflowed:
            return
        self._peers.add(peer)
        if len(self._peers) > MAX_NOTED:
            self.everything()

    def everything(self) -> None:
        """Too much changed to say peer by peer."""
        self._overflowed = True
        self._peers = set()

    def take(self) -> set[str] | None:
        """The peers changed since the last call; None: everything may have."""
        peers, overflowed = self._peers, self._overflowed
        self._peers, self._overflowed = set(), False
        return None if overflowed else peers
