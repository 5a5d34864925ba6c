"""DHT keys and namespaces. (Stream protocol ids live with their protocols:
``protocol.wire``, ``protocol.net.probe``.)"""

from __future__ import annotations

import base64
import hashlib

# DHT namespace of our records; bootstrap peers and everyone else register a
# validator for it (protocol.net.records) so forged records are refused.
DHT_NAMESPACE = "echo-swarm"

# Learners announce themselves as providers of this key; nodes look it up to
# find a job without knowing any learner's address.
JOB_DIRECTORY_KEY = "echo-swarm/jobs/v1"
# A learner announces itself there again every JOB_DIRECTORY_REFRESH_S; our
# DHT peers forget an announcement not renewed within JOB_DIRECTORY_TTL_S.
JOB_DIRECTORY_REFRESH_S = 5 * 60
JOB_DIRECTORY_TTL_S = 15 * 60

# Public peers that relay for others (`echo-node join --relay`) announce
# themselves under this key; nodes behind NAT look here for relays beyond
# the bootstrap peers.
RELAY_DIRECTORY_KEY = "echo-swarm/relays/v1"


# A record key other Kademlia implementations can store: rust-libp2p and
# go-libp2p begin a PUT_VALUE with a FIND_NODE on the record key, and
# py-libp2p 0.8.1 resets a FIND_NODE whose key is neither a multihash nor at
# most 50 bytes. This prefix plus 32 base32 characters is 46 bytes.
MAX_FIND_NODE_KEY = 50
MANIFEST_PREFIX = f"/{DHT_NAMESPACE}/m/"
_MANIFEST_DIGEST_BYTES = 20  # 160 bits: finding a peer id that collides is out of reach


def manifest_key(learner_id: str) -> str:
    """The DHT key of a learner's newest signed manifest: its peer id hashed
    into 46 bytes, so that a validator recomputes it from the record's signer."""
    digest = hashlib.sha256(learner_id.encode()).digest()[:_MANIFEST_DIGEST_BYTES]
    return MANIFEST_PREFIX + base64.b32encode(digest).decode().lower()


def legacy_manifest_key(learner_id: str) -> str:
    """The manifest key of protocol version 1 before the hashed one (64 bytes
    for an Ed25519 peer id, too long for other implementations' FIND_NODE).
    Learners write it beside ``manifest_key`` and nodes read it second, until
    protocol version 2 drops it (docs/protocol.md, section 7)."""
    return f"/{DHT_NAMESPACE}/{learner_id}"


def manifest_keys(learner_id: str) -> tuple[str, ...]:
    """Every key a learner's manifest is under, in the order nodes read them."""
    return manifest_key(learner_id), legacy_manifest_key(learner_id)


SWARM_PREFIX = f"/{DHT_NAMESPACE}/j/"
_SWARM_DIGEST_BYTES = 20


def swarm_key(job_id: str) -> str:
    """DHT provider key under which every process of a job announces itself:
    the job id hashed into 46 bytes. A rust-libp2p or go-libp2p peer's
    ``start_providing`` first sends FIND_NODE on the key, which py-libp2p
    0.8.1 resets past ``MAX_FIND_NODE_KEY`` bytes (tests/protocol/test_foreign_put.py)."""
    digest = hashlib.sha256(job_id.encode()).digest()[:_SWARM_DIGEST_BYTES]
    return SWARM_PREFIX + base64.b32encode(digest).decode().lower()


def legacy_swarm_key(job_id: str) -> str:
    """The provider key of protocol version 1 before the short one (53 bytes:
    other implementations cannot announce under it). Processes announce and
    look up under both until protocol version 2 drops it (docs/protocol.md, section 7)."""
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:32]
    return f"echo-swarm/job/{digest}/peers"


def swarm_keys(job_id: str) -> tuple[str, ...]:
    """Every provider key of a job's swarm, the current one first."""
    return swarm_key(job_id), legacy_swarm_key(job_id)
