"""DHT keys and namespaces. (Stream protocol ids live with their protocols:
``protocol.wire``, ``protocol.probe``.)"""

from __future__ import annotations

import hashlib

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
