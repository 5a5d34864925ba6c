"""DHT record validation: a manifest record is accepted only if its learner signed it.

The key is ``/echo-swarm/<learner peer id>``, so nobody but that learner can
write it, and among several valid values the newest version wins.
"""

from __future__ import annotations

from libp2p.records.validator import Validator

from protocol import codec, manifest
from protocol.errors import ProtocolError
from protocol.ids import DHT_NAMESPACE
from protocol.messages import Manifest


class InvalidRecord(ProtocolError):
    pass


def decode_record(key: str, value: bytes) -> Manifest:
    prefix = f"/{DHT_NAMESPACE}/"
    if not key.startswith(prefix):
        raise InvalidRecord(f"key {key!r} is not in the {DHT_NAMESPACE} namespace")
    learner_id = key[len(prefix) :]
    try:
        record = codec.decode(value, Manifest)
        manifest.check(record, learner_id)
    except ProtocolError as exc:
        raise InvalidRecord(f"refused DHT record {key}: {exc}") from None
    return record


class ManifestRecordValidator(Validator):
    def validate(self, key: str, value: bytes) -> None:
        decode_record(key, value)

    def select(self, key: str, values: list[bytes]) -> int:
        def version(value: bytes) -> int:
            try:
                return decode_record(key, value).version
            except InvalidRecord:
                return -1

        versions = [version(v) for v in values]
        return versions.index(max(versions))
