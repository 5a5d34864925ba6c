"""Verified weight chunks and signed manifests on disk, for the last K versions.

Layout under ``root``::

    manifests/<version>.msgpack   the learner-signed manifest
    chunks/<sha256 hex>           a chunk, named by its hash

A chunk is written only after its hash matched the signed manifest, and
atomically (temp file + rename). Every manifest and chunk is checked again
when a restarted process loads the store, so files need no fsync: one torn by
a power cut fails its check and is fetched again. Chunks shared by two
versions are stored once. Keeping only the newest ``keep`` versions bounds
disk use; the base of a kept update stays as long as the update.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from protocol import codec
from protocol import manifest as manifests
from protocol.errors import ChunkHashMismatch, ProtocolError
from protocol.messages import Manifest
from protocol.models import updates
from protocol.process.files import TMP_SUFFIX, write_atomic
from protocol.process.logs import event

log = logging.getLogger(__name__)


class VersionStore:
    def __init__(self, root: Path, *, learner_id: str, keep: int):
        self.root = root
        self.learner_id = learner_id
        self.keep = keep
        self._manifest_dir = root / "manifests"
        self._chunk_dir = root / "chunks"
        self._manifest_dir.mkdir(parents=True, exist_ok=True)
        self._chunk_dir.mkdir(parents=True, exist_ok=True)
        self.manifests: dict[int, Manifest] = {}
        self.held: dict[int, set[int]] = {}
        self._load()

    def _load(self) -> None:
        """Re-read what a previous run left, checking every signature and hash."""
        for path in self._manifest_dir.glob("*.msgpack"):
            try:
                m = codec.decode(path.read_bytes(), Manifest)
                manifests.check(m, self.learner_id)
            except (OSError, ProtocolError) as exc:
                event(log, logging.WARNING, "dropping unreadable manifest", path=path, error=exc)
                path.unlink(missing_ok=True)
                continue
            self.manifests[m.version] = m
            self.held[m.version] = {i for i in range(len(m.chunk_hashes)) if self._valid_on_disk(m, i)}
        self._collect_garbage(starting=True)

    def _chunk_path(self, digest: bytes) -> Path:
        return self._chunk_dir / digest.hex()

    def _valid_on_disk(self, m: Manifest, idx: int) -> bool:
        try:
            manifests.check_chunk(m, idx, self._chunk_path(m.chunk_hashes[idx]).read_bytes())
        except (OSError, ChunkHashMismatch):
            return False
        return True

    # --- queries ---------------------------------------------------------------

    def newest(self) -> Manifest | None:
        return self.manifests[max(self.manifests)] if self.manifests else None

    def chunks_held(self, version: int) -> frozenset[int]:
        return frozenset(self.held.get(version, ()))

    def holds(self, version: int, idx: int) -> bool:
        return idx in self.held.get(version, ())

    def complete(self, version: int) -> bool:
        m = self.manifests.get(version)
        return m is not None and len(self.held[version]) == len(m.chunk_hashes)

    def base_of(self, version: int) -> Manifest | None:
        """The manifest of the base ``version`` is an update against, if held
        (and exactly that base, or a variant of it: ``updates.check_base``)."""
        m = self.manifests.get(version)
        base = self.manifests.get(m.base_version) if m is not None and not updates.standalone(m) else None
        if base is None:
            return None
        try:
            updates.check_base(m, base)
        except updates.UpdateRefused:
            return None
        return base

    def usable(self, version: int) -> bool:
        """Complete, and so is its base if it is an update: it can be rebuilt."""
        m = self.manifests.get(version)
        if m is None or not self.complete(version):
            return False
        return updates.standalone(m) or self.base_of(version) is not None and self.complete(m.base_version)

    def rebuild(self, version: int) -> bytes:
        """The full weights of a usable version (``protocol.models.updates.rebuild``)."""
        return updates.rebuild(*self._parts(version))

    def check_signed(self, version: int) -> None:
        """``UpdateRefused`` unless every byte of a usable version and its base
        is as signed (``protocol.models.updates.check_signed``; no LoRA merge)."""
        updates.check_signed(*self._parts(version))

    def _parts(self, version: int) -> tuple[Manifest, bytes, Manifest | None, bytes | None]:
        m = self.manifests[version]
        base = None if updates.standalone(m) else self.base_of(version)
        return m, self.assemble(version), base, None if base is None else self.assemble(base.version)

    def read(self, version: int, idx: int) -> bytes | None:
        """Chunk ``idx`` of ``version`` if held (None otherwise)."""
        if idx not in self.held.get(version, ()):
            return None
        try:
            return self._chunk_path(self.manifests[version].chunk_hashes[idx]).read_bytes()
        except OSError:
            self.held[version].discard(idx)
            return None

    def assemble(self, version: int) -> bytes:
        """The whole weights file of a complete version."""
        m = self.manifests[version]
        parts = [self.read(version, i) for i in range(len(m.chunk_hashes))]
        if any(p is None for p in parts):
            raise FileNotFoundError(f"version {version} is not complete on disk")
        return b"".join(parts)  # type: ignore[arg-type]

    # --- updates -----------------------------------------------------------------

    def add_manifest(self, m: Manifest) -> None:
        """Start holding ``m`` (signature already checked); drop versions beyond ``keep``."""
        if m.version in self.manifests:
            return
        manifests.check(m, self.learner_id)
        write_atomic(self._manifest_dir / f"{m.version}.msgpack", codec.encode(m))
        self.manifests[m.version] = m
        # Chunks already on disk from an earlier version (same hash) count at once.
        self.held[m.version] = {i for i in range(len(m.chunk_hashes)) if self._valid_on_disk(m, i)}
        self._collect_garbage()

    def save_chunk(self, m: Manifest, idx: int, data: bytes) -> None:
        """Check chunk ``idx`` of ``m`` and write it to disk; ``ChunkHashMismatch``
        (and nothing written) if it is wrong. Touches no shared state, so it
        may run in a worker thread; call ``mark_held`` afterwards."""
        manifests.check_chunk(m, idx, data)
        write_atomic(self._chunk_path(m.chunk_hashes[idx]), data)

    def mark_held(self, version: int, idx: int) -> bool:
        """Record a saved chunk; False if the version was dropped meanwhile."""
        if version not in self.held:
            return False
        self.held[version].add(idx)
        return True

    def write(self, version: int, idx: int, data: bytes) -> None:
        """``save_chunk`` then ``mark_held``, in the caller's thread."""
        self.save_chunk(self.manifests[version], idx, data)
        self.mark_held(version, idx)

    def _collect_garbage(self, *, starting: bool = False) -> None:
        """Keep the newest ``keep`` versions and the bases they are updates against."""
        kept = sorted(self.manifests)[-self.keep :]
        bases = {self.manifests[v].base_version for v in kept}
        for version in [v for v in self.manifests if v not in kept and v not in bases]:
            del self.manifests[version]
            del self.held[version]
            (self._manifest_dir / f"{version}.msgpack").unlink(missing_ok=True)
        wanted = {h.hex() for m in self.manifests.values() for h in m.chunk_hashes}
        for path in self._chunk_dir.iterdir():
            # A temporary file is a chunk being written in a worker thread
            # (``save_chunk``), unless left by a crash: those go at start-up.
            in_flight = path.name.endswith(TMP_SUFFIX) and not starting
            if path.name not in wanted and not in_flight:
                path.unlink(missing_ok=True)

    def disk_bytes(self) -> int:
        """Bytes of the chunks on disk (not counting chunks being written)."""
        total = 0
        for path in self._chunk_dir.iterdir():
            if path.name.endswith(TMP_SUFFIX):
                continue
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile (older than the newest K)
                total += path.stat().st_size
        return total
