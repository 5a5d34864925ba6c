"""Protocol ids and DHT keys. A protocol id's version changes with its wire format."""

from __future__ import annotations

import hashlib

WORK_PROTOCOL = "/echo-swarm/work/1.3.0"
ROLLOUT_PROTOCOL = "/echo-swarm/rollout/1.0.0"
RECEIPTS_PROTOCOL = "/echo-swarm/receipts/1.0.0"
CHUNK_PROTOCOL = "/echo-swarm/chunk/1.0.0"
HAVE_PROTOCOL = "/echo-swarm/have/1.0.0"
# Answered by bootstrap peers and learners for `echo-node doctor`.
PUNCH_PROTOCOL = "/echo-swarm/punch/1.0.0"
UPLOAD_PROTOCOL = "/echo-swarm/upload/1.0.0"

# DHT namespace of our records; bootstrap peers and everyone else register a
# validator for it (protocol.records) so forged records are refused.
DHT_NAMESPACE = "echo-swarm"

# Learners announce themselves as providers of this key; nodes look it up to
# find a job without knowing any learner's address.
JOB_DIRECTORY_KEY = "echo-swarm/jobs/v1"

# Public peers that relay for others (`echo-node join --relay`) announce
# themselves under this key; nodes behind NAT look here for relays beyond
# the bootstrap peers.
RELAY_DIRECTORY_KEY = "echo-swarm/relays/v1"


def manifest_key(learner_id: str) -> str:
    """The DHT key of a learner's newest signed manifest."""
    return f"/{DHT_NAMESPACE}/{learner_id}"


def swarm_key(job_id: str) -> str:
    """DHT provider key under which every process of a job announces itself.

    The job id is hashed in: Kademlia peers (py-libp2p and go-libp2p alike)
    refuse provider keys over 80 bytes, and job ids may be 64 characters.
    """
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:32]
    return f"echo-swarm/job/{digest}/peers"
