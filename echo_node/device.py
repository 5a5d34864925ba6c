"""Which processor a node generates on, and how many CPU threads it uses.

``--device auto`` takes the best that works: a GPU the backend can use
(``BackendSpec.gpu_kinds``: torch can use CUDA or Apple's MPS when the
installed torch was built with them; llama.cpp only when llama-cpp-python was
built with a GPU backend, README "A gaming PC"), else the CPU. Asking for a
device that is not there is refused with what to install
(``BackendSpec.no_gpu``), never silently run on the CPU.

A GPU is described by the backend that runs on it (``BackendSpec.gpu``):
torch through ``torch.cuda``, llama.cpp through its own device list. A
llama.cpp node never asks torch: torch's CUDA in the same process as
llama.cpp's crashed its model load on an H200 (docs/inference.md, "A gaming PC").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

DEVICES = ("auto", "cpu", "cuda", "mps", "vulkan")


class DeviceUnavailable(RuntimeError):
    """The asked-for device cannot be used here; the message says why."""


def available_ram() -> int:
    """Bytes of RAM available to new work (MemAvailable on Linux)."""
    import psutil

    return int(psutil.virtual_memory().available)


def ram_usage() -> tuple[int, int]:
    """RAM available now, and what this process holds (its RSS)."""
    import psutil

    return available_ram(), int(psutil.Process(os.getpid()).memory_info().rss)


@dataclass(frozen=True)
class Device:
    kind: str  # cpu, cuda, mps, vulkan
    name: str  # for people: "CPU (8 cores)", "NVIDIA GeForce RTX 4090"
    memory: int  # bytes free for a model on it when it was chosen (RAM for the CPU); 0: unknown
    # Bytes free on it now and bytes this process holds there, read as the
    # backend that runs on it reads them (``echo_node.memory.free_bytes``).
    usage: Callable[[], tuple[int, int]] = field(default=ram_usage, compare=False, repr=False)

    @property
    def gpu(self) -> bool:
        return self.kind != "cpu"


def default_threads() -> int:
    """Physical cores minus one: the volunteer keeps a core for their own use."""
    import psutil

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return max(1, cores - 1)


def cpu() -> Device:
    import psutil

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return Device("cpu", f"CPU ({cores} cores)", available_ram())
