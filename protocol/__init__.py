"""The language every Echo Swarm role speaks.

The stream protocols, one module each (``protocol.wire``: messages, size
limits, client and handler side), the msgpack codec and length-prefixed
framing under them, identities and signatures, weight manifests, DHT keys and
records, and the libp2p host factory with our security settings. Nothing here imports ``echo_node``,
``echo_learner`` or ``bootstrap``.
"""
