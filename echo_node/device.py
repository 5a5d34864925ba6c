"""Which processor a node generates on, and how many CPU threads it uses.

``--device auto`` takes the best that works: a GPU the backend can use
(``BackendSpec.gpu_kinds``: torch can use CUDA or Apple's MPS when the
installed torch was built with them; llama.cpp only when llama-cpp-python was
built with a GPU backend, README "A gaming PC"), else the CPU. Asking for a
device that is not there is refused with what to install
(``BackendSpec.no_gpu``), never silently run on the CPU.
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


def gpu(kind: str) -> Device:
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
