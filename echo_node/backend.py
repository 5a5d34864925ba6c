"""The inference-backend interface (``echo_node.backend_choice`` picks one for this machine).

A backend holds one policy version and samples completions from it:

    prepare(config_json, weights, digest)
                                   get a version (safetensors bytes, with
                                   their SHA-256 when known; or the file of
                                   its ``variant``) ready to run, while
                                   generation goes on
    use(prepared)                  swap it in (between generations)
    close()                        free it when the node leaves
    generate(prompts, ...)       group_size samples per prompt, each sampled
                                 token with its log-prob

Every backend samples exactly at the assignment's temperature over the whole
vocabulary (no top-k/top-p/min-p) and reports the log-softmax of its raw
logits: those log-probs are the behaviour policy the learner importance-weights
against, and the learner recomputes them to verify the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from echo_node.device import Device
from protocol.models.updates import UpdateLimits
from protocol.wire.work import WorkAssignment

if TYPE_CHECKING:
    from echo_node.model_shape import ModelShape


@dataclass(frozen=True, kw_only=True)
class BackendSpec:
    """What the node knows of a backend before running it, kept in the
    backend's own module (its ``SPEC``; ``echo_node.backend_choice`` lists
    them). Adding a backend is one such module, plus the learner's tolerance
    rows for its dtypes (``echo_learner/verify/tolerance.py``)."""

    name: str  # as rollouts declare it; the learner's tolerance rows use it
    title: str  # for people: "llama.cpp"
    dtypes: tuple[str, ...]  # what --dtype may ask of it (besides auto)
    # --dtype auto: the first of these whose model fits in memory (most exact
    # first); a backend whose auto follows the device lists only its CPU dtype.
    auto_dtypes: tuple[str, ...]
    installed: Callable[[], bool]
    install: str  # how to install it, when it is not
    gpu_kinds: Callable[[], list[str]]  # GPU kinds it can use here, best first
    # The GPU of a kind as the backend itself sees it: its name and free
    # memory, from the backend's own library (never another backend's).
    gpu: Callable[[str], Device]
    no_gpu: Callable[[str], str]  # why it cannot use a GPU of that kind here
    report: Callable[[], str]  # what is installed and where it can run, for ``echo-node doctor``
    # Memory (echo_node.memory): bytes a weight takes while a version is
    # converted for it (None: it loads tensors as published), KV cells its
    # context allocates with the model (0: per generate call), whether it
    # merges LoRA adapters into the weights (else it loads them as adapters),
    # whether it offloads layers to a GPU (so fewer may fit), and what one
    # generate call allocates (``call_need(shape, sequences, prompt_tokens, new_tokens)``).
    # On a GPU, a backend whose context comes with the model sizes it to the
    # memory there: up to ``gpu_cells`` cells of ``cell_bytes(shape)`` each.
    converted_bytes: float | None
    kv_cells: int
    merges_lora: bool
    offloads_layers: bool
    call_need: Callable[[ModelShape, int, int, int], Any]  # -> echo_node.memory.Need
    smaller: str = ""  # where to turn when its model does not fit
    gpu_cells: int = 0
    cell_bytes: Callable[[ModelShape], int] | None = None
    # The backend itself: make(dtype, threads, work_dir, device).
    make: Callable[[str, int, Path, Device], Backend]


@dataclass(frozen=True)
class Sample:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]


class Backend(Protocol):
    spec: BackendSpec
    name: str  # as rollouts declare it (``spec.name``)
    dtype: str  # the precision its log-probs come from: "f32", "f16", "q8_0"
    auto_dtype: bool  # the node may set ``dtype`` to what fits (before the first prepare)
    device: Device  # where it generates
    kv_cells: int  # KV cells its context holds for the model loaded (0: allocated per generate call)
    # The variant of a base it runs in place of the base when the learner
    # publishes one (``protocol.models.updates.VARIANTS``), or "".
    variant: str

    def prepare(self, config_json: str, weights: bytes, digest: bytes = b"", variant: str = "") -> Any: ...

    def prepare_lora(
        self,
        config_json: str,
        base_key: bytes,
        base_weights: Callable[[], bytes],
        adapter: bytes,
        base_variant: str = "",
        limits: UpdateLimits = ...,
    ) -> Any:
        """A LoRA version, ready for ``use``: ``adapter`` (safetensors,
        ``protocol.models.updates``) on the base whose weights' SHA-256 is
        ``base_key`` (``base_weights()`` gives them, called only when the
        backend does not hold that base yet; ``base_variant``: the base comes
        as that variant). ``UpdateRefused`` for an adapter beyond ``limits``,
        before anything is loaded."""

    def use(self, prepared: Any) -> None: ...

    def load(self, config_json: str, weights: bytes) -> None:
        """``use(prepare(...))``: for callers that do not generate concurrently."""

    def close(self) -> None:
        """Free the loaded version (and any file made for it)."""

    def generate(
        self,
        prompts: list[tuple[int, ...]],
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        stop_ids: tuple[int, ...],
    ) -> list[list[Sample]]: ...


def generate_in_calls(backend: Backend, work: WorkAssignment, per_call: int) -> list[list[Sample]]:
    """An assignment's groups, ``per_call`` prompts per generate call (what
    fits in memory: ``echo_node.memory.prompts_per_call``)."""
    prompts = [p.tokens for p in work.prompts]
    groups: list[list[Sample]] = []
    for i in range(0, len(prompts), per_call):
        groups.extend(
            backend.generate(
                prompts[i : i + per_call],
                work.group_size,
                work.max_new_tokens,
                work.temperature,
                work.stop_token_ids,
            )
        )
    return groups
