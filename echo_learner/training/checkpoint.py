"""Learner checkpoints: everything needed to continue a run, written atomically.

A checkpoint holds the model and optimiser state, the step, the version, every
random generator's state, the replay buffer and the prompt counter. It is
written to a temporary file, fsynced and renamed over the previous one, then
the directory is fsynced: a crash at any moment leaves either the old or the
new checkpoint, never a torn one. Loading uses ``torch.load(weights_only=True)``,
which refuses anything but tensors and plain containers (no arbitrary
unpickling, even of our own files).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from protocol.process.files import replacing

FORMAT = 1


class CheckpointError(RuntimeError):
    pass


def save(path: Path, state: dict[str, Any]) -> None:
    with replacing(path, durable=True) as tmp:
        torch.save({"format": FORMAT, **state}, tmp)


def load(path: Path) -> dict[str, Any]:
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path}") from None
    except Exception as exc:  # torch raises several types for bad files
        raise CheckpointError(f"unreadable checkpoint {path}: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a format-{FORMAT} learner checkpoint")
    return state


def rng_state(rng: random.Random) -> dict[str, Any]:
    version, internal, gauss = rng.getstate()
    return {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}


def restore_rng(rng: random.Random, state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    rng.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
