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

from dataclasses import dataclass
from typing import Any, Protocol

from echo_node.device import Device
from protocol.wire.work import WorkAssignment


@dataclass(frozen=True)
class Sample:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]


class Backend(Protocol):
    name: str  # as rollouts declare it: "torch" or "llama"
    dtype: str  # the precision its log-probs come from: "f32", "f16", "q8_0"
    auto_dtype: bool  # the node may set ``dtype`` to what fits (before the first prepare)
    device: Device  # where it generates
    # The variant of a base it runs in place of the base when the learner
    # publishes one (``protocol.updates.VARIANTS``), or "".
    variant: str

    def prepare(self, config_json: str, weights: bytes, digest: bytes = b"", variant: str = "") -> Any: ...

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
