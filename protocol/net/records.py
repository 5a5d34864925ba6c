"""DHT record validation: a manifest record is accepted only if its learner signed it.

The key is derived from the learner's peer id (``protocol.ids.manifest_keys``:
a hashed key and, during the deprecation window, ``/echo-swarm/<peer id>``),
so a record is valid only under the keys of the learner that signed it:
nobody else can write them. Among several valid values the newest version wins.
"""

from __future__ import annotations

from libp2p.records.validator import Validator

from protocol import codec, manifest
from protocol.errors import ProtocolError
from protocol.ids import DHT_NAMESPACE, manifest_keys
from protocol.messages import Manifest


class InvalidRecord(ProtocolError):
    pass


def decode_record(key: str, value: bytes) -> Manifest:
    """The manifest ``value`` holds, if it is valid under ``key``: signed by
    the learner whose manifest key ``key`` is. Raises ``InvalidRecord``."""
    if not key.startswith(f"/{DHT_NAMESPACE}/"):
        raise InvalidRecord(f"key {key!r} is not in the {DHT_NAMESPACE} namespace")
    try:
        record = codec.decode(value, Manifest)
    except ProtocolError as exc:
        raise InvalidRecord(f"refused DHT record {key}: {exc}") from None
    # The hashed key names its learner only through a digest: recompute it
    # from the signer the record claims, whose signature is checked next.
    if key not in manifest_keys(record.learner_id):
        raise InvalidRecord(f"refused DHT record {key}: not a key of its signer {record.learner_id}")
    try:
        manifest.check(record, record.learner_id)
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
