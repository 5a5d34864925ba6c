"""The inference-backend interface, and choosing one for this machine.

A backend holds one policy version and samples completions from it:

    prepare(config_json, weights)  get a version (safetensors bytes) ready to
                                   run, while generation goes on
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

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from echo_node.device import Device, DeviceUnavailable, choose_device, default_threads
from protocol.wire.work import WorkAssignment

INSTALL_LLAMA = (
    'llama.cpp is not installed: pip install "echo-swarm[llama]" (from the repository: '
    "pip install -e '.[llama]'; it builds llama.cpp, which takes a few minutes)"
)


@dataclass(frozen=True)
class Sample:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]


class Backend(Protocol):
    name: str  # as rollouts declare it: "torch" or "llama"
    dtype: str  # the precision its log-probs come from: "f32", "f16", "q8_0"
    auto_dtype: bool  # the node may set ``dtype`` to what fits (before the first prepare)
    device: Device  # where it generates

    def prepare(self, config_json: str, weights: bytes) -> Any: ...

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


class BackendUnavailable(RuntimeError):
    """The asked-for backend cannot run here; the message says what to do."""


def llama_installed() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "gguf"))


def choose(name: str, dtype: str, threads: int, work_dir: Path, device: str = "auto") -> tuple[Backend, str]:
    """The backend to run and why it was chosen (``name``: auto, torch or
    llama; ``dtype`` auto lets the node pick llama.cpp's from the job's model
    and free memory; ``threads`` 0: physical cores minus one)."""
    if name == "auto":
        if llama_installed():
            name, why = "llama", "auto: llama.cpp is installed"
        else:
            name, why = "torch", "auto: llama.cpp is not installed (pip install -e '.[llama]' to use it)"
    else:
        why = "asked for with --backend"
    if name == "llama" and not llama_installed():
        raise BackendUnavailable(INSTALL_LLAMA)
    if name == "torch" and dtype not in ("auto", "f32", "bf16", "f16"):
        raise BackendUnavailable(f"the torch backend runs f32, bf16 or f16, not {dtype} (use --backend llama)")
    if name == "llama" and dtype not in ("auto", "f32", "f16", "q8_0"):
        raise BackendUnavailable(f"the llama.cpp backend runs f32, f16 or q8_0, not {dtype} (use --backend torch)")
    try:
        where, why_device = choose_device(device, name)
    except DeviceUnavailable as exc:
        raise BackendUnavailable(str(exc)) from None
    threads = threads or default_threads()
    why = f"{why}; on {where.name} ({why_device}); CPU threads: {threads}"
    if name == "llama":
        from echo_node.backend_llama import LlamaBackend

        return LlamaBackend(dtype, threads, work_dir, where), why
    from echo_node.backend_torch import TorchBackend

    return TorchBackend(threads, where, dtype), why
