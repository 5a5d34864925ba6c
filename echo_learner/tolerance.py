"""How far an honest node's log-probs may be from the learner's recompute, per
(backend, dtype, device) the node declares in its batch.

A node samples with its own (possibly lower-precision) weights and kernels and
reports the log-prob of each token it sampled; the learner recomputes them in
f32. Rounding makes them differ, by an amount that depends on the backend, its
dtype and the hardware's kernels, so each combination gets its own bounds:

- ``worst``: on any one token; ``mean``: over the batch. Rounding errors are
  heavy-tailed and grow with depth, hence two bounds: the mean catches a
  forger who shifts many log-probs a little; one who shifts a few by less
  than ``worst`` moves their importance weights by at most exp(worst), which
  the PPO clip then bounds.
- ``z``: the token-plausibility limit (|surprise z-score| over the batch,
  echo_learner/verify.py): honest samples stay near 0 whatever the dtype.

A combination missing here is refused (``unsupported_dtype``): the bounds are
not the node's to choose (e.g. llama q4_1, which no backend of ours produces,
for a looser tolerance; or torch on Vulkan, which does not exist).

Measured against the learner's f32 recompute (tests/node/test_llama_backend.py,
bench/plausibility.py, >= 10,000 honest rollouts per backend and dtype; the
x3 rows have every weight of the built-in model tripled, the hardest case
found; "all three": the initial, x2 and x3 models together), worst / mean:

    llama.cpp on the CPU  f32            f16            q8_0
      built-in, trained   1e-5 / 3e-7    3e-3 / 1e-4    0.11 / 3e-3
      built-in, x3        2e-5 / 2e-6    3e-2 / 3e-3    0.56-1.15 / 7e-2
      SmolLM2-135M        2e-5 / 8e-6    2e-2 / 3e-3    0.88 / 0.10
    torch on the CPU      f32            f16            bf16
      built-in, all three 2e-5 / 2e-6    7e-2 / 5e-3    0.57 / 4e-2
      SmolLM2-135M        <1e-4 / <1e-5  8e-2 / 4e-3    0.96 / 3.5e-2

(SmolLM2: 96 rollouts of up to 64 tokens per dtype at temperature 0.7 on its
chat prompts; its bf16 worst token varied 0.27-0.96 between batches.)

A batch's mean is noisier the fewer tokens it holds: SmolLM2 in llama.cpp
q8_0 answering the reverse task (4 answers of 4 tokens a batch, temperature
1) gave batch means up to 0.20 (worst token 1.09) over 400 batches, and the
end-to-end test (tests/test_real_model.py) once refused such an honest batch
under a mean bound of 0.3; the bound is now 0.6. A forger who shifts every
reported log-prob by that much moves its importance ratios by at most
e^0.6, past the PPO clip, which then drops those tokens' gradients; the
plausibility z still catches tokens that were not sampled.

Some families compute a step of their own in lower precision inside a
backend, whatever the weights' dtype: llama.cpp's CPU GELU (Gemma's MLP) looks
its input up in an f16 table (GGML_GELU_FP16, ggml-cpu/vec.h). On the tiny
Gemma 2 and 3 models of tests/families.py its f32 worst token was 1.8e-3 to
5.6e-3 (bench/models.py, 2,048 rollouts) and, with a LoRA adapter, up to
1.4e-2 (mean 8e-4), past the f32 bound; such rows (``FAMILY``) replace the
backend's own for that family.

On GPUs (cuda, mps, vulkan) kernels sum in other orders and llama.cpp's CUDA
matmuls convert activations differently; no GPU was at hand to measure them
yet, so GPUs get the CPU's bounds of the same backend and dtype until
``bench/plausibility.py --device cuda`` has measured them (``tests/test_gpu.py``
checks them on a GPU machine).
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
# measured (table above), so that honest nodes are never refused.
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
    # Gemma's GELU runs in f16 in llama.cpp on the CPU.
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
