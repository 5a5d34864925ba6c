"""The arithmetic of the backend and dtype a node declares, run by the learner.

The learner recomputes every batch in f32. An honest node of a lower
precision lands some way from that, by an amount that depends on the model,
the version and the very tokens: SmolLM2-135M in llama.cpp q8_0 is ~0.06 nats
a token away on average, a tiny random model ~0.003. So no fixed bound tells
an honest q8_0 node from one that runs Q5_0 or Q4_K (0.2-0.3 on SmolLM2) and
declares q8_0. What does tell them apart is the same batch recomputed in the
declared arithmetic: an honest node is about as far from f32 as that
emulation is, a cheaper one several times farther (``echo_learner.verify.evidence``,
the precision test; docs/learner.md has the figures).

The emulations copy the version's model:

- torch f16 / bf16: the model in that dtype, as the torch backend runs it;
- llama.cpp f16: every matrix rounded to f16 and each matrix product's input
  too (ggml converts activations to the weight's type);
- llama.cpp q8_0: every matrix and each matrix product's input quantised to
  q8_0 blocks of 32 with an f16 scale, as ggml's CPU kernels compute them.
  A LoRA adapter's own matrices stay f32, as llama.cpp applies them.

They are not bit-exact (ggml sums in other orders and in places other
types), but their distance from f32 is within ~10 % of the real backend's on
average (docs/learner.md), which is what the test compares.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable

import torch

Q8_BLOCK = 32


def q8_0(x: torch.Tensor) -> torch.Tensor:
    """``x`` through ggml's q8_0 format: blocks of 32 along the last dim, each
    an f16 scale (its largest magnitude / 127) and 32 int8 values."""
    blocks = x.float().reshape(-1, Q8_BLOCK)
    scale = blocks.abs().amax(-1, keepdim=True) / 127.0
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    return (torch.round(blocks * inverse) * scale.half().float()).reshape(x.shape).to(x.dtype)


def f16(x: torch.Tensor) -> torch.Tensor:
    return x.half().to(x.dtype)


# (backend, dtype) -> how a matrix and a matrix product's input are rounded there.
ROUNDING: dict[tuple[str, str], Callable[[torch.Tensor], torch.Tensor]] = {
    ("llama", "q8_0"): q8_0,
    ("llama", "f16"): f16,
}
TORCH_DTYPES = {("torch", "f16"): torch.float16, ("torch", "bf16"): torch.bfloat16}


def can_emulate(backend: str, dtype: str, device: str = "cpu") -> bool:
    """Whether the learner knows the arithmetic of ``backend`` in ``dtype``
    on ``device`` (f32 is the recompute itself: nothing to emulate). Only
    the CPU's is measured: GPU kernels round otherwise (issue 53 measures
    them), and until then a GPU node is held to the per-batch bounds alone."""
    return device == "cpu" and ((backend, dtype) in ROUNDING or (backend, dtype) in TORCH_DTYPES)


def emulated(
    model: torch.nn.Module, backend: str, dtype: str, shared: dict[int, torch.nn.Parameter] | None = None
) -> torch.nn.Module:
    """A copy of ``model`` that computes as ``backend`` in ``dtype`` does.

    ``shared`` holds the emulated form of parameters every version of a LoRA
    model shares (its frozen base, ``echo_learner.training.lora.frozen_copy``): each is
    made once, so an emulated version costs a copy of its adapter, not of the
    model."""
    memo: dict[int, object] = {}
    if shared is not None and hasattr(model, "peft_config"):
        for name, p in model.named_parameters():
            if "lora_" not in name:
                if id(p) not in shared:
                    shared[id(p)] = torch.nn.Parameter(_rounded(model, name, p, backend, dtype), requires_grad=False)
                memo[id(p)] = shared[id(p)]
    done = {id(p) for p in memo.values()}
    twin = copy.deepcopy(model, memo).eval()
    if (backend, dtype) in TORCH_DTYPES:
        return twin.to(TORCH_DTYPES[backend, dtype])
    rounding = ROUNDING[backend, dtype]
    with torch.no_grad():
        for name, module in twin.named_modules():
            if "lora_" in name:  # an adapter's own matrices: f32 in llama.cpp
                continue
            weight = getattr(module, "weight", None)
            if _rounds(module, rounding) and id(weight) not in done:
                weight.copy_(rounding(weight))
                done.add(id(weight))
            if isinstance(module, torch.nn.Linear) and module.in_features % Q8_BLOCK == 0:
                module.register_forward_pre_hook(lambda _m, args, r=rounding: (r(args[0]), *args[1:]))
    return twin


def _rounds(module: torch.nn.Module, rounding: Callable) -> bool:
    """Does llama.cpp store ``module``'s weight in the rounded type? Matrices
    (linear layers, embeddings) yes, when q8_0's blocks fit their rows."""
    if not isinstance(module, torch.nn.Embedding | torch.nn.Linear):
        return False
    return rounding is not q8_0 or module.weight.shape[-1] % Q8_BLOCK == 0


def _rounded(model: torch.nn.Module, name: str, p: torch.Tensor, backend: str, dtype: str) -> torch.Tensor:
    """Parameter ``name`` of ``model`` as the emulated model holds it."""
    if (backend, dtype) in TORCH_DTYPES:
        return p.detach().to(TORCH_DTYPES[backend, dtype])
    module = model.get_submodule(name.rpartition(".")[0])
    rounding = ROUNDING[backend, dtype]
    if name.endswith("weight") and _rounds(module, rounding):
        return rounding(p.detach())
    return p.detach().clone()


class Emulations:
    """Emulated copies of recent versions, made when first asked for; at
    most ``keep`` are held (each is a copy of the model, or of its adapter
    for a LoRA model: the emulated base is made once and shared)."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._held: OrderedDict[tuple[int, str, str], torch.nn.Module] = OrderedDict()
        self._shared: dict[tuple[str, str], dict[int, torch.nn.Parameter]] = {}

    def get(self, version: int, model: torch.nn.Module, backend: str, dtype: str) -> torch.nn.Module:
        key = (version, backend, dtype)
        if key not in self._held:
            self._held[key] = emulated(model, backend, dtype, self._shared.setdefault((backend, dtype), {}))
            while len(self._held) > self.keep:
                self._held.popitem(last=False)
        self._held.move_to_end(key)
        return self._held[key]
