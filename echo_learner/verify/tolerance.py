"""How far an honest node's log-probs may be from the learner's recompute, per
(backend, dtype, device) the node declares in its batch: the per-batch
backstop. What tells a node that declares one row and runs another (Q5_0
for q8_0) is the evidence over its batches (``echo_learner.verify.evidence``),
against the declared arithmetic (``echo_learner.verify.emulate``).

A node samples with its own (possibly lower-precision) weights and kernels and
reports the log-prob of each token it sampled; the learner recomputes them in
f32. Rounding makes them differ, by an amount that depends on the backend, its
dtype, the hardware's kernels and the model, so each combination gets its own
bounds:

- ``worst``: on any one token; ``mean``: over the batch. Rounding errors are
  heavy-tailed and grow with depth, hence two bounds: the mean catches a
  forger who shifts many log-probs a little; one who shifts a few by less
  than ``worst`` moves their importance weights by at most exp(worst), which
  the PPO clip then bounds.
- ``z``: the token-plausibility limit (|surprise z-score| over the batch,
  echo_learner/verify/verifier.py): honest samples stay near 0 whatever the dtype.

A combination missing here is refused (``unsupported_dtype``): the bounds are
not the node's to choose (e.g. llama q4_1, which no backend of ours produces,
for a looser tolerance; or torch on Vulkan, which does not exist).

Each bound is a few times the largest difference measured on honest rollouts
of several models (``bench/plausibility.py``, ``bench/cheaters.py --only
honest``); the measurements and the commands that made them are in
docs/learner.md ("Calibrated rows"). GPUs (cuda, mps, vulkan) get the CPU's
bounds of the same backend and dtype until measured there
(``bench/plausibility.py --device cuda``, ``tests/test_gpu.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    """Bounds on |reported - recomputed| log-probs, and on the plausibility z."""

    worst: float
    mean: float
    z: float


# Bounds per (backend, dtype) on the CPU: a few times the largest error
# measured (docs/learner.md), so that honest nodes are never refused.
CPU = {
    ("llama", "f32"): Tolerance(worst=5e-3, mean=5e-4, z=8.0),
    ("llama", "f16"): Tolerance(worst=0.1, mean=1e-2, z=8.0),
    ("llama", "q8_0"): Tolerance(worst=3.0, mean=0.6, z=10.0),
    ("torch", "f32"): Tolerance(worst=5e-3, mean=5e-4, z=8.0),
    ("torch", "f16"): Tolerance(worst=0.5, mean=3e-2, z=8.0),
    ("torch", "bf16"): Tolerance(worst=3.0, mean=0.2, z=8.0),
}
# Where each backend runs (echo_node/device.py): torch on CUDA and Apple's
# MPS, llama.cpp also on Vulkan.
GPUS = {"torch": ("cuda", "mps"), "llama": ("cuda", "mps", "vulkan")}

TOLERANCE: dict[tuple[str, str, str], Tolerance] = {
    (backend, dtype, device): t for (backend, dtype), t in CPU.items() for device in ("cpu", *GPUS[backend])
}
# (family, backend, dtype) -> bounds that replace the backend's for that family.
FAMILY = {
    # Gemma's GELU runs in f16 in llama.cpp on the CPU (GGML_GELU_FP16,
    # ggml-cpu/vec.h): its f32 rollouts are as far off as f16's.
    ("gemma2", "llama", "f32"): CPU[("llama", "f16")],
    ("gemma3_text", "llama", "f32"): CPU[("llama", "f16")],
}


def tolerance(backend: str, dtype: str, device: str = "cpu", family: str = "llama") -> Tolerance | None:
    """The bounds for rollouts ``backend`` made in ``dtype`` on ``device`` for
    a model of ``family`` (None: a combination no backend of ours runs)."""
    allowed = TOLERANCE.get((backend, dtype, device))
    if allowed is None:
        return None
    return FAMILY.get((family, backend, dtype), allowed)
