"""The language every Echo Swarm role speaks.

Messages and their msgpack codec, identities and signatures, weight manifests,
protocol ids, the length-prefixed framing used on every stream, and the libp2p
host factory with our security settings. Nothing here imports ``echo_node``,
``echo_learner`` or ``bootstrap``.
"""
