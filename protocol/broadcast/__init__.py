"""Peer-assisted, pipelined weight broadcast.

- ``scheduler``: which chunk to ask which peer for, and when to give up on a
  request; ``uploads``: which requests to serve, in what order (the learner's
  rounds). Pure logic, no I/O, driven by the real engine and by the simulator.
- ``serving``: answering manifest and chunk requests.
- ``store``: verified chunks and manifests on disk, last K versions.
- ``ratelimit``: the upload token bucket.
- ``engine``: the libp2p side: have-streams, chunk serving and fetching.
"""
