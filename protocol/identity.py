"""Ed25519 identities: key files, libp2p peer ids, signing and verification.

A key file holds the 32-byte Ed25519 seed, hex-encoded, mode 0600. The same
file always gives the same peer id. A signer's public key is recovered from
its peer id (Ed25519 peer ids embed the key), so a signed message only needs
to carry the signer's peer id.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from protocol.codec import canonical_bytes
from protocol.errors import SignatureError
from protocol.process.files import write_atomic

T = TypeVar("T")


class KeyFileError(Exception):
    """A key file that is missing, unreadable or not an Ed25519 seed."""


@dataclass(frozen=True)
class Identity:
    seed: bytes

    @classmethod
    def generate(cls) -> Identity:
        return cls(os.urandom(32))

    @property
    def key_pair(self) -> KeyPair:
        return create_new_key_pair(self.seed)

    @cached_property
    def peer_id(self) -> ID:
        return ID.from_pubkey(self.key_pair.public_key)

    @property
    def peer_id_str(self) -> str:
        return self.peer_id.to_base58()

    @cached_property
    def _private_key(self) -> Ed25519PrivateKey:
        # Built once: the learner signs a receipt for every batch.
        return Ed25519PrivateKey.from_private_bytes(self.seed)

    def sign_bytes(self, data: bytes) -> bytes:
        return self._private_key.sign(data)

    def sign(self, msg: T) -> T:
        """The message with its ``signature`` field set over its canonical bytes."""
        return replace(msg, signature=self.sign_bytes(canonical_bytes(msg)))  # type: ignore[type-var]


def load_or_create(path: Path) -> Identity:
    """Load the identity at ``path``, creating it (mode 0600) if absent."""
    if path.exists():
        return load(path)
    identity = Identity.generate()
    save(identity, path)
    return identity


def load_or_exit(prog: str, path: Path) -> Identity:
    """``load_or_create``, reporting a bad key file in one line and exiting 2."""
    from protocol.process.config import fail

    try:
        return load_or_create(path)
    except KeyFileError as exc:
        fail(prog, str(exc))


def save(identity: Identity, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, identity.seed.hex() + "\n", durable=True, mode=0o600)  # the key: only its owner reads it


def load(path: Path) -> Identity:
    try:
        text = path.read_text().strip()
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise KeyFileError(f"key file {path} is readable by others (mode {mode:o}); run: chmod 600 {path}")
    try:
        seed = bytes.fromhex(text)
    except ValueError:
        seed = b""
    if len(seed) != 32:
        raise KeyFileError(f"{path} is not an Echo Swarm key file (want 64 hex digits)")
    return Identity(seed)


@lru_cache(maxsize=4096)  # the learner checks every batch's signer: most are the same few thousand peers
def public_key_of(peer_id: str) -> Ed25519PublicKey:
    """The Ed25519 key embedded in a peer id; ``SignatureError`` if there is none."""
    try:
        key = ID.from_base58(peer_id).extract_public_key()
    except Exception:  # base58/multihash parsing raises several unrelated types
        key = None
    if key is None or key.get_type().name != "Ed25519":
        raise SignatureError(f"peer id {peer_id!r} does not embed an Ed25519 key")
    return Ed25519PublicKey.from_public_bytes(key.to_bytes())


def verify_bytes(peer_id: str, data: bytes, signature: bytes) -> None:
    try:
        public_key_of(peer_id).verify(signature, data)
    except InvalidSignature:
        raise SignatureError(f"bad signature from {peer_id}") from None


def verify(msg: Any, signer: str) -> None:
    """Check ``msg.signature`` was made by ``signer`` over the canonical bytes."""
    verify_bytes(signer, canonical_bytes(msg), msg.signature)
