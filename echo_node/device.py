"""Which processor a node generates on, and how many CPU threads it uses.

``--device auto`` takes the best that works: a GPU the backend can use, else
the CPU. torch can use CUDA or Apple's MPS when the installed torch was built
with them; llama.cpp can offload to a GPU only when llama-cpp-python was
built with a GPU backend (CUDA, Metal, Vulkan: README, "A gaming PC"), which
``llama_supports_gpu_offload()`` tells. Asking for a device that is not there
is refused with what to install, never silently run on the CPU.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

DEVICES = ("auto", "cpu", "cuda", "mps", "vulkan")


class DeviceUnavailable(RuntimeError):
    """The asked-for device cannot be used here; the message says why."""


@dataclass(frozen=True)
class Device:
    kind: str  # cpu, cuda, mps, vulkan
    name: str  # for people: "CPU (8 cores)", "NVIDIA GeForce RTX 4090"
    memory: int  # bytes free for a model on it now (RAM for the CPU); 0: unknown

    @property
    def gpu(self) -> bool:
        return self.kind != "cpu"


def default_threads() -> int:
    """Physical cores minus one: the volunteer keeps a core for their own use."""
    import psutil

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return max(1, cores - 1)


def available_ram() -> int:
    """Bytes of RAM available to new work (MemAvailable on Linux)."""
    import psutil

    return int(psutil.virtual_memory().available)


def cpu() -> Device:
    import psutil

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return Device("cpu", f"CPU ({cores} cores)", available_ram())


def llama_gpu_kind() -> str | None:
    """The GPU backend the installed llama.cpp was built with, if any."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    import llama_cpp

    if not llama_cpp.llama_supports_gpu_offload():
        return None
    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    for marker, kind in (("CUDA", "cuda"), ("ROCm", "cuda"), ("HIP", "cuda"), ("Metal", "mps"), ("Vulkan", "vulkan")):
        if marker in info:
            return kind
    return "cuda"  # offload works but names no backend we know: the common case


def torch_gpu_kinds() -> list[str]:
    """GPU kinds the installed torch can run on, best first."""
    if importlib.util.find_spec("torch") is None:
        return []
    import torch

    kinds = []
    if torch.cuda.is_available():
        kinds.append("cuda")
    if torch.backends.mps.is_available():
        kinds.append("mps")
    return kinds


def _gpu(kind: str) -> Device:
    """A GPU of ``kind`` with its free memory (0 where nothing tells it)."""
    if kind == "cuda" and "cuda" in torch_gpu_kinds():
        import torch

        free, _total = torch.cuda.mem_get_info()
        return Device("cuda", torch.cuda.get_device_name(), int(free))
    if kind == "mps" and "mps" in torch_gpu_kinds():
        import torch

        # Apple GPUs share the RAM: what torch may still allocate there.
        limit = torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory()
        return Device("mps", "Apple GPU (Metal)", max(0, int(limit)))
    return Device(kind, f"{kind} GPU (llama.cpp)", 0)


def choose_device(asked: str, backend: str) -> tuple[Device, str]:
    """The device ``backend`` (torch or llama) runs on for ``--device asked``,
    and why. Raises ``DeviceUnavailable``."""
    usable = torch_gpu_kinds() if backend == "torch" else [k for k in [llama_gpu_kind()] if k]
    if asked == "auto":
        if usable:
            return _gpu(usable[0]), f"auto: {backend} can use the {usable[0]} GPU"
        return cpu(), f"auto: no GPU {backend} can use here"
    if asked == "cpu":
        return cpu(), "asked for with --device"
    if asked in usable:
        return _gpu(asked), "asked for with --device"
    raise DeviceUnavailable(f"--device {asked}: {_missing(asked, backend)}")


def _missing(kind: str, backend: str) -> str:
    if backend == "torch":
        if kind == "vulkan":
            return "torch does not run on Vulkan (use --backend llama with a Vulkan build of llama.cpp)"
        needs = "a CUDA build of torch and an NVIDIA driver" if kind == "cuda" else "a Mac with Apple silicon"
        return f"torch cannot use {kind} here: it needs {needs} (README, 'A gaming PC')"
    found = llama_gpu_kind()
    if found:
        return f"the installed llama.cpp offloads to {found}, not {kind}"
    return (
        "the installed llama.cpp was built without GPU offload: reinstall llama-cpp-python with "
        "CMAKE_ARGS=-DGGML_CUDA=on (or -DGGML_METAL=on, -DGGML_VULKAN=on; README, 'A gaming PC')"
    )
