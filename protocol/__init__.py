"""The language every Echo Swarm role speaks, and what carries it.

The modules directly here are the shared language: the messages and the
bounds they are checked against (``messages``, ``schema``), the msgpack
codec and length-prefixed framing under them (``codec``, ``framing``,
``kinds``), identities and signatures (``identity``), signed weight
manifests (``manifest``), one-line invites (``invite``), DHT keys (``ids``),
the protocol's errors (``errors``) and the libp2p glue for stream protocols
(``rpc``). They import only each other and ``protocol.process``; three name
what they describe elsewhere (``tests/test_layout.py`` lists them and why).

The folders, by concern:

- ``wire``: the stream protocols, one module each (work, rollout, receipts,
  chunk, have).
- ``broadcast``: the peer-assisted weight broadcast (scheduling, serving,
  the chunk store, upload shares).
- ``net``: the way through home routers: the libp2p host and DHT, dialling,
  relays, AutoNAT, hole punching probes, UPnP, mDNS, connection limits and
  bans.
- ``models``: model formats every role reads or writes: families, GGUF
  export, LoRA adapters, updates against a base and their limits.
- ``process``: no protocol at all: configuration, logs, progress bars,
  tables, running a daemon, durable files, the allocator. Here so that
  node, learner and bootstrap share one copy without importing each other.

Nothing here imports ``echo_node``, ``echo_learner`` or ``bootstrap``.
"""
