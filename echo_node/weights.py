"""The policy version a node runs, and how the next one gets here.

The node's counterpart of the learner's ``publishing.py``: follow the versions
the learner names, fetch each through the swarm (``protocol.broadcast``, with
a progress bar), check it (every signed digest, the config against the
weights, the memory it needs), prepare it in the backend beside the version
that is generating (for llama.cpp: write and load a GGUF, or only an adapter
on the base it holds) and swap it in between two generations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio
from safetensors import SafetensorError

from echo_node.backend import Backend
from echo_node.config import NodeConfig
from echo_node.guard import ModelLimits, check_version
from echo_node.memory import choose_dtype, fit_backend, gib, load_need
from echo_node.model_shape import ModelShape, model_shape
from echo_node.refusals import DoesNotFit, Refused
from protocol.broadcast.engine import BroadcastEngine
from protocol.broadcast.following import VersionTooLarge
from protocol.errors import ProtocolError
from protocol.messages import Manifest
from protocol.models import updates
from protocol.models.updates import UpdateRefused
from protocol.process.logs import event
from protocol.process.progress import progress
from protocol.rpc import RequestFailed

log = logging.getLogger(__name__)


async def download_newer(engine: BroadcastEngine, manifest: Manifest, held: int) -> int:
    """Fetch ``manifest``'s version through the swarm, with a progress bar, until
    some version newer than ``held`` is complete; return the newest complete one.

    That may be an older version than ``manifest``'s: the engine finishes a
    download that is well under way before it starts a newer one.
    """
    engine.want(manifest)
    total = manifest.total_size
    with progress(f"weights v{manifest.version}", total, in_bytes=True, transient=True) as bar:

        def update(held_chunks: int, peers: int) -> None:
            bar(min(held_chunks * manifest.chunk_size, total), peers=peers)

        return await engine.wait_newer(held, update)


class Weights:
    def __init__(self, backend: Backend, config: NodeConfig, free: Callable[[], int]):
        """``free()``: the memory the backend may still use, in bytes."""
        self.backend = backend
        self.config = config
        self.free = free
        self.engine: BroadcastEngine | None = None  # once the node has joined the job
        self.learner_id = ""  # whose manifests to follow
        self.version = -1
        self.limits: ModelLimits | None = None  # of the loaded version: what assignments may ask
        self.shape: ModelShape | None = None  # of the loaded version: what memory it needs
        # Held while generating: a swap waits for the running generation only.
        self.in_use = trio.Lock()
        self._update_lock = trio.Lock()
        self._wanted = -1  # newest version the learner has named
        self._wanted_changed = trio.Event()

    def join(self, engine: BroadcastEngine, learner_id: str) -> None:
        """The node has joined the job: follow ``learner_id``'s versions through ``engine``."""
        self.engine, self.learner_id = engine, learner_id

    def fit_job(self, model_config: str) -> None:
        """Refuse (``Refused``) a job whose model this machine cannot hold,
        before fetching anything; else fit the backend to it."""
        free = self.free()
        need = fit_backend(self.backend, model_shape(model_config), free)
        event(
            log,
            logging.INFO,
            "the job's model fits",
            backend=self.backend.name,
            dtype=self.backend.dtype,
            device=self.backend.device.kind,
            need=need.describe(),
            free=gib(free),
        )

    def check_job(self, record: Manifest) -> None:
        """Refuse (``Refused``) a job whose model this machine could not build
        or hold, changing nothing (``fit_job`` fits the backend to the job taken)."""
        asked = "auto" if self.backend.auto_dtype else self.backend.dtype
        shape = model_shape(record.model_config)
        try:
            choose_dtype(shape, self.backend.spec, asked, self.free())
        except Refused as exc:
            raise DoesNotFit(str(exc)) from None

    def named(self, version: int) -> None:
        """The learner named ``version`` (``follow`` fetches it when newer)."""
        if version > self._wanted:
            self._wanted = version
            self._wanted_changed.set()

    async def follow(self) -> None:
        """Fetch and load each newer version the learner names, in the background."""
        while True:
            if self._wanted <= self.version:
                self._wanted_changed = trio.Event()
                await self._wanted_changed.wait()
                continue
            try:
                await self.update(self._wanted)
            except (VersionTooLarge, Refused) as exc:
                # Asking again soon would not change it: one line, then wait.
                event(log, logging.WARNING, "refused a version", version=self._wanted, reason=exc)
                await trio.sleep(self.config.max_retry_s)
            except (RequestFailed, ProtocolError) as exc:
                event(log, logging.INFO, "could not fetch a newer version yet", error=exc)
                await trio.sleep(self.config.retry_s)  # backoff before asking again

    async def update(self, version: int) -> None:
        """Fetch the learner's newest version (at least ``version``) and load the
        newest complete one, which may be an older one finished first."""
        assert self.engine is not None, "the node has not joined a job"
        async with self._update_lock:
            if self.version >= version:
                return
            manifest = await self.engine.fetch_manifest_to_follow(self.learner_id)
            if manifest.version < version:
                raise RequestFailed(f"learner offers v{manifest.version} but assigned v{version}")
            newest = await download_newer(self.engine, manifest, self.version)
            loaded = self.engine.store.manifests[newest]
            # A signed config that describes no model we can build is refused
            # here, before any work, whatever the format: a LoRA version's
            # config reaches no other check before the swap.
            shape = model_shape(loaded.model_config)
            limits = ModelLimits.from_config(loaded.model_config)  # model_shape checked its fields
            # Preparing (for llama.cpp: writing a GGUF) overlaps generation;
            # only the swap waits for a running generation to finish.
            try:
                prepared = await trio.to_thread.run_sync(self._prepare_version, newest)
            except UpdateRefused as exc:
                raise Refused(f"v{newest}: {exc}") from exc
            async with self.in_use:
                self.backend.use(prepared)
                self.version = newest
                self.limits, self.shape = limits, shape
            event(log, logging.INFO, "loaded weights", version=newest, format=loaded.format)

    def _prepare_version(self, version: int) -> Any:
        """Get ``version`` ready in the backend, every signed digest checked
        (``UpdateRefused`` otherwise, as for anything it declares beyond the
        node's ``UpdateLimits``): a LoRA version from its adapter and
        the base the backend holds (llama.cpp: as an adapter; torch: merged
        into a model), a variant as it is, any other rebuilt into full
        weights (protocol.models.updates)."""
        assert self.engine is not None
        store, m = self.engine.store, self.engine.store.manifests[version]
        if m.format != updates.LORA:
            return self._prepare(m.model_config, store.rebuild(version), m.weights_digest, updates.variant_of(m))
        base = store.base_of(version)
        adapter = store.assemble(version)
        updates.check_lora(m, adapter, base)
        assert base is not None  # check_lora refuses an adapter without its base
        variant = updates.variant_of(base)

        def base_weights() -> bytes:
            weights = updates.check_signed(base, store.assemble(base.version), None, None)
            if not variant:
                check_version(base.model_config, weights)
            return weights

        try:
            # The node's limits on what an adapter declares (``UpdateRefused``
            # beyond them, before the base is assembled or anything loaded).
            return self.backend.prepare_lora(
                m.model_config, base.weights_digest, base_weights, adapter, variant, self.config
            )
        except (ValueError, RuntimeError, SafetensorError) as exc:
            raise Refused(f"could not load the weights: {exc}") from exc

    def _prepare(self, config_json: str, weights: bytes, digest: bytes = b"", variant: str = "") -> Any:
        """Check a version (``digest``: its weights' SHA-256, as signed), then
        build it in the backend; ``Refused`` if either fails. A ``variant``
        file goes to the backend as it is: llama.cpp checks its tensors
        against the hyperparameters it carries."""
        shape = model_shape(config_json) if variant else check_version(config_json, weights)
        need = load_need(shape, self.backend.spec, self.backend.dtype, variant=variant, cells=self.backend.kv_cells)
        free = self.free()
        if need.total > free:
            raise Refused(f"this version needs about {need.describe()}; {gib(free)} is free")
        try:
            return self.backend.prepare(config_json, weights, digest, variant)
        except (ValueError, RuntimeError, SafetensorError) as exc:  # passed the checks, still does not load
            raise Refused(f"could not load the weights: {exc}") from exc
