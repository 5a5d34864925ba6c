"""Peer-assisted, pipelined weight broadcast.

- ``scheduler``: which chunk to ask which peer for, and which requests to
  serve: pure logic, no I/O, driven by the real engine and by the simulator.
- ``store``: verified chunks and manifests on disk, last K versions.
- ``ratelimit``: the upload token bucket.
- ``engine``: the libp2p side: have-streams, chunk serving and fetching.
"""
