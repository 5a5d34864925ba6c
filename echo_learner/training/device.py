"""Where the learner trains, recomputes log-probs and scores held-out prompts
(``--device``).

``auto`` takes a CUDA GPU when the installed torch sees one, else the CPU;
Apple's MPS only when asked for (``--device mps``). Asking for a device that
is not there is refused with what to install, before anything is written.
Whatever the device, the learner computes in f32 without TF32 matmuls, so
its recompute of a node's log-probs is as exact on a GPU as on the CPU
(nodes' tolerances: echo_learner/verify/verifier.py).
"""

from __future__ import annotations

import torch

DEVICES = ("auto", "cpu", "cuda", "mps")


class DeviceUnavailable(RuntimeError):
    """The asked-for device cannot be used here; the message says why."""


def choose(asked: str) -> tuple[torch.device, str]:
    """The torch device for ``--device asked``, and why."""
    if asked == "auto":
        if torch.cuda.is_available():
            return _cuda(), f"auto: CUDA GPU {torch.cuda.get_device_name()}"
        return torch.device("cpu"), "auto: torch sees no CUDA GPU here"
    if asked == "cpu":
        return torch.device("cpu"), "asked for with --device"
    if asked == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable(
                "--device cuda: torch cannot use a CUDA GPU here: it needs a CUDA build of torch and an "
                "NVIDIA driver (README, 'A gaming PC')"
            )
        return _cuda(), f"asked for with --device: {torch.cuda.get_device_name()}"
    if asked == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceUnavailable(
                "--device mps: torch cannot use Apple's MPS here (it needs a Mac with Apple silicon)"
            )
        return torch.device("mps"), "asked for with --device"
    raise DeviceUnavailable(f"--device {asked}: not one of {', '.join(DEVICES)}")


def _cuda() -> torch.device:
    # TF32 matmuls would put the recompute ~1e-3 away from f32 nodes.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch.device("cuda")


def of(model: torch.nn.Module) -> torch.device:
    """The device ``model``'s weights are on (inputs must go there too)."""
    return next(model.parameters()).device
