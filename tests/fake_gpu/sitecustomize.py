"""A GPU for llama.cpp that is not there, in every Python process started with
this folder first on PYTHONPATH (a node and the children it starts).

- ``ECHO_FAKE_GPU=cuda``: llama.cpp's device list (``echo_node.llama_devices``)
  shows one such GPU with 8 GiB free. The CPU build ignores the layers
  offloaded to it, so the node really runs, on the CPU, as it would on a GPU.
- ``ECHO_FAKE_GPU_CRASH=1``: llama.cpp's model load says a line, as llama.cpp
  does, and the process dies of a segmentation fault, as on the H200 (issue 71).
- ``ECHO_FORBID_TORCH=1``: importing torch prints where it happened and fails.
"""

import importlib.abc
import importlib.machinery
import os
import signal
import sys
import traceback

GiB = 2**30


def _fake_devices(module) -> None:
    kind = os.environ["ECHO_FAKE_GPU"]

    class FakeGpu(module.GpuDevice):
        def usage(self):
            return 8 * GiB, 0

    module.gpu_devices = lambda: [FakeGpu(kind, f"Fake {kind} GPU (tests/fake_gpu)", 0)]


def _crash_on_load(module) -> None:
    llama_cpp = module.llama_cpp

    def load(path, params):
        module._forward_log(4, b"ggml_fake_init: the fake GPU refused (tests/fake_gpu)\n", None)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)

    llama_cpp.llama_model_load_from_file = load


class _Watch(importlib.abc.MetaPathFinder):
    """Patches modules as they are imported; refuses torch when told to."""

    def find_spec(self, name, path, target=None):
        if name == "torch" and os.environ.get("ECHO_FORBID_TORCH"):
            print("FORBIDDEN: torch imported here:\n" + "".join(traceback.format_stack()), file=sys.stderr)
            raise ImportError("torch is forbidden in this process (tests/fake_gpu)")
        patch = {
            "echo_node.llama_devices": _fake_devices if os.environ.get("ECHO_FAKE_GPU") else None,
            "echo_node.backend_llama": _crash_on_load if os.environ.get("ECHO_FAKE_GPU_CRASH") else None,
        }.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Watch())
