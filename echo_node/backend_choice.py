"""Choosing the inference backend for this machine (``--backend``, ``--dtype``, ``--device``).

The choice knows the backends (``echo_node.backend_llama``, ``echo_node.backend_torch``,
imported only when chosen); they know only the interface (``echo_node.backend``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from echo_node.backend import Backend
from echo_node.device import DeviceUnavailable, choose_device, default_threads

INSTALL_LLAMA = (
    'llama.cpp is not installed: pip install "echo-swarm[llama]" (from the repository: '
    "pip install -e '.[llama]'; it builds llama.cpp, which takes a few minutes)"
)


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
