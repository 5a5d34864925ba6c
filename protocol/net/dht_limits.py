"""Bounds on what other peers can make our DHT store.

py-libp2p 0.8.1 stores up to 50,000 records of any size and provider records
for any number of keys; only our validated namespaces reach the record store
(``strict_validation``), but a stranger with many identities could still fill
memory with valid, signed manifests, or announce itself for endless keys.
So, per process:

- records: at most ``MAX_RECORD_BYTES`` of record values in all; the oldest
  go first (ours are re-put by their owners, who hold the newest);
- provider records: at most ``MAX_PROVIDER_KEYS`` keys (the key whose newest
  announcement is oldest goes first: live keys are re-announced) and at most
  ``MAX_KEYS_PER_PROVIDER`` keys per providing peer (further ones ignored);
- the job directory's provider records live ``JOB_DIRECTORY_TTL_S`` (learners
  announce again every ``JOB_DIRECTORY_REFRESH_S``), not py-libp2p's 48 hours:
  a learner long gone is not offered to joining nodes, and does not hold one
  of the 20 places py-libp2p keeps per key.
"""

from __future__ import annotations

import time
from typing import Any

from protocol.ids import JOB_DIRECTORY_KEY, JOB_DIRECTORY_TTL_S

MAX_RECORD_BYTES = 64 * 2**20
MAX_PROVIDER_KEYS = 4096
MAX_KEYS_PER_PROVIDER = 64
# Provider keys whose records expire sooner than py-libp2p's default.
PROVIDER_TTL_S = {JOB_DIRECTORY_KEY.encode(): JOB_DIRECTORY_TTL_S}


def bound_dht(dht: Any) -> None:
    """Apply the bounds to a py-libp2p ``KadDHT``'s value and provider stores."""
    bound_value_store(dht.value_store)
    bound_provider_store(dht.provider_store)


def bound_value_store(store: Any, max_bytes: int = MAX_RECORD_BYTES) -> None:
    put, put_record = store.put, store.put_record

    def evict() -> None:
        total = sum(len(record.value) for record, _ in store.store.values())
        for key in list(store.store):  # insertion order: oldest first
            if total <= max_bytes:
                return
            total -= len(store.store.pop(key)[0].value)

    def bounded_put(key: bytes, value: bytes, validity: float = 0.0) -> None:
        put(key, value, validity)
        evict()

    def bounded_put_record(key: bytes, record: Any) -> None:
        store.store.pop(key, None)  # a replaced record becomes the newest
        put_record(key, record)
        evict()

    store.put, store.put_record = bounded_put, bounded_put_record


def bound_provider_store(
    store: Any, max_keys: int = MAX_PROVIDER_KEYS, max_per_provider: int = MAX_KEYS_PER_PROVIDER
) -> None:
    add_provider, get_providers = store.add_provider, store.get_providers

    def drop_expired(key: bytes) -> None:
        ttl = PROVIDER_TTL_S.get(key)
        records = store.providers.get(key)
        if ttl is None or records is None:
            return
        cutoff = time.time() - ttl
        for peer in [peer for peer, record in records.items() if record.timestamp < cutoff]:
            del records[peer]
        if not records:
            del store.providers[key]

    def fresh_providers(key: bytes) -> list:
        drop_expired(key)
        return get_providers(key)

    def bounded_add_provider(key: bytes, provider: Any) -> None:
        drop_expired(key)
        providers = store.providers
        peer = str(provider.peer_id) if provider and provider.peer_id else ""
        if key not in providers or peer not in providers[key]:
            if sum(peer in records for records in providers.values()) >= max_per_provider:
                return
        if key not in providers and len(providers) >= max_keys:
            stalest = min(providers, key=lambda k: max((r.timestamp for r in providers[k].values()), default=0))
            del providers[stalest]
        add_provider(key, provider)

    store.add_provider, store.get_providers = bounded_add_provider, fresh_providers
