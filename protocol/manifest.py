"""Weights as content-addressed chunks, described by a signed manifest."""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass, replace

from protocol import codec
from protocol.errors import ChunkHashMismatch, DecodeError
from protocol.identity import Identity, verify
from protocol.messages import MAX_CHUNKS, UNSIGNED, Manifest
from protocol.models.updates import FULL, LORA, VARIANTS

DEFAULT_CHUNK_SIZE = 1024 * 1024


@dataclass(frozen=True)
class Update:
    """A version published as an update (format "delta" or "lora") against ``base``."""

    format: str
    base: Manifest
    payload: bytes


@functools.lru_cache(maxsize=64)
def manifest_digest(m: Manifest) -> bytes:
    """A manifest's id in Have messages (cached: it is needed per message)."""
    return codec.digest(m)


def split(data: bytes, chunk_size: int) -> list[bytes]:
    """Fixed-size chunks; the last one may be shorter. Empty data has no chunks."""
    return [data[i : i + chunk_size] for i in range(0, len(data), chunk_size)]


def chunk_len(manifest: Manifest, index: int) -> int:
    """The exact size chunk ``index`` must have."""
    start = index * manifest.chunk_size
    return min(manifest.chunk_size, manifest.total_size - start)


def build(
    identity: Identity,
    *,
    job_id: str,
    version: int,
    parent_version: int,
    task: str,
    model_config: str,
    tokenizer_digest: bytes,
    weights: bytes,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    update: Update | None = None,
) -> tuple[Manifest, list[bytes]]:
    """Chunk ``weights`` (safetensors bytes) and sign a manifest for them; with
    ``update``, chunk its payload instead (a delta or adapter against a base,
    see ``protocol.models.updates``) and sign ``weights``' digest as what it rebuilds."""
    payload = weights if update is None else update.payload
    chunks = split(payload, chunk_size)
    if len(chunks) > MAX_CHUNKS:
        raise ValueError(f"{len(chunks)} chunks exceed the limit of {MAX_CHUNKS}")
    manifest = Manifest(
        job_id=job_id,
        version=version,
        parent_version=parent_version,
        task=task,
        model_config=model_config,
        tokenizer_digest=tokenizer_digest,
        format=FULL if update is None else update.format,
        base_version=-1 if update is None else update.base.version,
        base_digest=b"" if update is None else codec.digest(update.base),
        # An adapter is checked as itself: its merge rounds on the node's hardware.
        weights_digest=hashlib.sha256(payload if update is not None and update.format == LORA else weights).digest(),
        total_size=len(payload),
        chunk_size=chunk_size,
        chunk_hashes=tuple(hashlib.sha256(c).digest() for c in chunks),
        created_ms=int(time.time() * 1000),
        learner_id=identity.peer_id_str,
        signature=UNSIGNED,
    )
    return identity.sign(manifest), chunks


def build_variant(identity: Identity, base: Manifest, fmt: str, data: bytes) -> tuple[Manifest, list[bytes]]:
    """Chunk ``data``, ``base``'s weights in the variant format ``fmt`` (e.g. a
    q8_0 GGUF, ``protocol.models.updates``), and sign a manifest for it: the same
    version, naming ``base`` by its digest."""
    if fmt not in VARIANTS or base.format != FULL:
        raise ValueError(f"a {fmt} variant of a {base.format} version")
    chunks = split(data, base.chunk_size)
    if len(chunks) > MAX_CHUNKS:
        raise ValueError(f"{len(chunks)} chunks exceed the limit of {MAX_CHUNKS}")
    manifest = replace(
        base,
        format=fmt,
        base_version=base.version,
        base_digest=codec.digest(base),
        weights_digest=hashlib.sha256(data).digest(),
        total_size=len(data),
        chunk_hashes=tuple(hashlib.sha256(c).digest() for c in chunks),
        created_ms=int(time.time() * 1000),
        learner_id=identity.peer_id_str,
        signature=UNSIGNED,
    )
    return identity.sign(manifest), chunks


def check(manifest: Manifest, learner_id: str | None = None) -> None:
    """Verify the learner's signature and the manifest's internal consistency.

    ``learner_id`` pins the expected signer; without it the manifest's own
    ``learner_id`` is used (trust on first use, e.g. at discovery).
    """
    signer = learner_id or manifest.learner_id
    if manifest.learner_id != signer:
        raise DecodeError(f"manifest names learner {manifest.learner_id}, expected {signer}")
    expected_chunks = -(-manifest.total_size // manifest.chunk_size)
    if len(manifest.chunk_hashes) != expected_chunks:
        raise DecodeError(f"manifest lists {len(manifest.chunk_hashes)} chunks, size implies {expected_chunks}")
    # A full version names no base; a variant names its own version; an update an older one.
    if manifest.format == FULL:
        names_base = manifest.base_version == -1
    elif manifest.format in VARIANTS:
        names_base = manifest.base_version == manifest.version
    else:
        names_base = 0 <= manifest.base_version < manifest.version
    if not names_base:
        raise DecodeError(
            f"manifest v{manifest.version} of format {manifest.format} names base v{manifest.base_version}"
        )
    if len(manifest.base_digest) != (0 if manifest.format == FULL else 32):
        raise DecodeError(f"manifest v{manifest.version}: base digest of {len(manifest.base_digest)} bytes")
    verify(manifest, signer)


def check_chunk(manifest: Manifest, index: int, data: bytes) -> None:
    """Raise ``ChunkHashMismatch`` unless ``data`` is exactly chunk ``index``."""
    if not 0 <= index < len(manifest.chunk_hashes):
        raise ChunkHashMismatch(f"chunk {index} not in manifest v{manifest.version}")
    if len(data) != chunk_len(manifest, index) or (hashlib.sha256(data).digest() != manifest.chunk_hashes[index]):
        raise ChunkHashMismatch(f"chunk {index} of v{manifest.version} does not match its hash")
