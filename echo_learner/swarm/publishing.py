"""How each policy version goes out: full weights, or an update against a base.

A *base* is a version published as full weights. Training every weight, each
later version is a delta against the newest base while the delta is at most
``max_update_ratio`` of the full weights; past that (the weights have drifted
far), the full weights go out and become the new base. Training LoRA, the
base is the frozen model, published once, and each version is its adapter.
``protocol.models.updates`` defines the formats; nodes fetch a base once and then
only updates. A LoRA base also goes out as a q8_0 GGUF (a *variant*), which
llama.cpp q8_0 nodes fetch in its place: built by the exporter nodes use, so
it is what they would make themselves, and deterministic, so its digest is
the same whoever rebuilds it.
"""

from __future__ import annotations

import importlib.util
import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from echo_learner.training.lora import LoraSettings, adapter_bytes, state_bytes
from protocol import manifest
from protocol.broadcast.store import VersionStore
from protocol.identity import Identity
from protocol.messages import Manifest
from protocol.models.gguf_export import f32_tensors, write_gguf
from protocol.models.updates import DELTA, FULL, LORA, Q8_GGUF, digest, encode_delta, merge_lora
from protocol.process.logs import event

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class JobManifestFields:
    """What every manifest of the job carries besides its version and weights
    (``protocol.manifest.build``'s arguments of the same names)."""

    job_id: str
    task: str  # the task's name
    model_config: str  # the model's config, as JSON
    tokenizer_digest: bytes
    chunk_size: int  # bytes per chunk of a version's file


class Publisher:
    def __init__(
        self,
        identity: Identity,
        job: JobManifestFields,
        *,
        max_update_ratio: float,
        lora: LoraSettings | None = None,
        frozen_base: bytes | None = None,
        q8_base: bool = False,
    ):
        """``q8_base``: with ``lora``, publish the base's q8_0 variant too."""
        if (lora is None) != (frozen_base is None):
            raise ValueError("a LoRA publisher needs the frozen base weights, and only it")
        self.identity = identity
        self.common = asdict(job)
        self.max_update_ratio = max_update_ratio
        self.lora = lora
        self.frozen_base = frozen_base
        self.q8_base = q8_base and lora is not None
        # The newest base: its manifest and its weights file.
        self.base: tuple[Manifest, bytes] | None = None

    def adopt_base(self, store: VersionStore) -> None:
        """After a restart: use the LoRA base published before, if the store holds it."""
        if self.frozen_base is None:
            return
        want = digest(self.frozen_base)
        for version in sorted(store.manifests, reverse=True):
            m = store.manifests[version]
            if m.format == FULL and m.weights_digest == want and store.complete(version):
                self.base = (m, self.frozen_base)
                return

    def needs_base(self) -> bool:
        """LoRA with no base out yet: the next version must be the frozen base."""
        return self.lora is not None and self.base is None

    def build_base(self, version: int) -> tuple[Manifest, list[bytes]]:
        assert self.frozen_base is not None
        return self._full(version, self.frozen_base, is_base=True)

    def build_variants(self, base: Manifest, scratch: Path) -> list[tuple[Manifest, list[bytes]]]:
        """The variants ``base`` (the LoRA base) is published in besides itself:
        its q8_0 GGUF when ``q8_base`` (written under ``scratch`` on the way)."""
        if not self.q8_base:
            return []
        if importlib.util.find_spec("gguf") is None:
            event(
                log,
                logging.WARNING,
                "not publishing a q8_0 base: the gguf package is missing (pip install 'echo-swarm[llama]')",
            )
            return []
        assert self.frozen_base is not None and base.weights_digest == digest(self.frozen_base)
        with tempfile.TemporaryDirectory(dir=scratch) as tmp:
            path = Path(tmp) / "base-q8_0.gguf"
            write_gguf(base.model_config, f32_tensors(self.frozen_base), path, "q8_0")
            data = path.read_bytes()
        return [manifest.build_variant(self.identity, base, Q8_GGUF, data)]

    def build(self, version: int, model: torch.nn.Module) -> tuple[Manifest, list[bytes]]:
        """Version ``version`` of ``model``, as an update when that pays."""
        if self.lora is not None:
            assert self.base is not None, "publish the base first (needs_base)"
            adapter = adapter_bytes(model, self.lora)
            if self._small(adapter, self.base[1]):
                return self._update(version, LORA, adapter)
            # An adapter as big as the model: ship the merged weights. Later
            # adapters still apply to the frozen base, which stays the base.
            return self._full(version, merge_lora(self.base[1], adapter), is_base=False)
        weights = state_bytes(model)
        if self.base is not None:
            delta = encode_delta(self.base[1], weights)
            if delta is not None and self._small(delta, weights):
                return self._update(version, DELTA, delta, weights)
        return self._full(version, weights, is_base=True)

    def _small(self, update: bytes, full: bytes) -> bool:
        return len(update) <= self.max_update_ratio * len(full)

    def _full(self, version: int, weights: bytes, *, is_base: bool) -> tuple[Manifest, list[bytes]]:
        signed, chunks = manifest.build(
            self.identity, version=version, parent_version=version - 1, weights=weights, **self.common
        )
        if is_base:
            self.base = (signed, weights)
        return signed, chunks

    def _update(
        self, version: int, fmt: str, payload: bytes, weights: bytes | None = None
    ) -> tuple[Manifest, list[bytes]]:
        assert self.base is not None
        return manifest.build(
            self.identity,
            version=version,
            parent_version=version - 1,
            weights=payload if weights is None else weights,
            update=manifest.Update(fmt, self.base[0], payload),
            **self.common,
        )
