"""The GPUs llama.cpp can offload to, as llama.cpp itself lists them (ggml's
device registry): their kind, name and free memory.

A llama.cpp node learns about its GPU from llama.cpp alone, never from torch:
torch's CUDA started in the same process crashed llama.cpp's model load on an
H200 (docs/inference.md, "A gaming PC"), and importing torch costs a node
seconds and hundreds of MB for nothing.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

from echo_node.device import Device

# ggml's backend registry names -> our device kinds (ROCm builds register as
# CUDA's backend compiled with HIP; Apple's Metal registers as "MTL").
GPU_MARKERS = (
    ("CUDA", "cuda"),
    ("ROCm", "cuda"),
    ("HIP", "cuda"),
    ("MTL", "mps"),
    ("Metal", "mps"),
    ("Vulkan", "vulkan"),
)
GGML_GPU_TYPES = (1, 2)  # enum ggml_backend_dev_type: GPU (own memory), IGPU (host memory)
UNKNOWN_FREE = 1 << 60  # a device that does not tell its memory: only --max-memory caps it


@functools.cache
def _ggml() -> ctypes.CDLL:
    """libggml from llama-cpp-python's build, with the device functions' signatures
    (ggml-backend.h; dlsym through libggml also finds libggml-base's)."""
    from llama_cpp._ggml import libggml

    signatures = {
        "ggml_backend_dev_count": ([], ctypes.c_size_t),
        "ggml_backend_dev_get": ([ctypes.c_size_t], ctypes.c_void_p),
        "ggml_backend_dev_type": ([ctypes.c_void_p], ctypes.c_int),
        "ggml_backend_dev_description": ([ctypes.c_void_p], ctypes.c_char_p),
        "ggml_backend_dev_backend_reg": ([ctypes.c_void_p], ctypes.c_void_p),
        "ggml_backend_reg_name": ([ctypes.c_void_p], ctypes.c_char_p),
        "ggml_backend_dev_memory": (
            [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
            None,
        ),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(libggml, name)
        function.argtypes, function.restype = argtypes, restype
    return libggml


@dataclass(frozen=True)
class GpuDevice:
    """A GPU in llama.cpp's device list."""

    kind: str  # cuda, mps, vulkan
    name: str  # its description: "NVIDIA H200"
    handle: int  # ggml_backend_dev_t

    def usage(self) -> tuple[int, int]:
        """Free bytes on it now (``UNKNOWN_FREE`` where the device does not
        say), and 0 for this process's share: ggml does not tell it apart."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        _ggml().ggml_backend_dev_memory(self.handle, ctypes.byref(free), ctypes.byref(total))
        return (free.value if total.value else UNKNOWN_FREE), 0

    def device(self) -> Device:
        return Device(self.kind, self.name, self.usage()[0], usage=self.usage)


def gpu_devices() -> list[GpuDevice]:
    """The GPUs the installed llama.cpp can use, in its order."""
    ggml, found = _ggml(), []
    for i in range(ggml.ggml_backend_dev_count()):
        handle = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(handle) not in GGML_GPU_TYPES:
            continue
        backend = ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(handle)).decode("utf-8", "replace")
        kind = next((k for marker, k in GPU_MARKERS if marker in backend), "cuda")
        description = ggml.ggml_backend_dev_description(handle).decode("utf-8", "replace")
        found.append(GpuDevice(kind, description or backend, handle))
    return found


def gpu_kinds() -> list[str]:
    """The GPU kinds llama.cpp can offload to here, best first."""
    return list(dict.fromkeys(d.kind for d in gpu_devices()))


def gpu(kind: str) -> Device:
    """The first GPU of ``kind`` in llama.cpp's list (``gpu_kinds`` has it)."""
    return next(d for d in gpu_devices() if d.kind == kind).device()
