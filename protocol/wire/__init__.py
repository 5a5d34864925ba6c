"""Echo Swarm's stream protocols, one module each: ``work``, ``rollout``,
``receipts``, ``chunk`` (manifests and chunks) and ``have``.

A module holds everything about its protocol: the protocol id, its messages
with their size limits, and both ends of the exchange (the client's and the
handler's) on plain byte streams (``protocol.framing.ByteStream``), so that
they run over a libp2p stream or an in-memory one alike. What to *do* with a
request (hand out prompts, verify a batch, read a chunk) is the caller's,
passed in as a function. ``docs/protocol.md`` describes the same for people
writing other clients.
"""
