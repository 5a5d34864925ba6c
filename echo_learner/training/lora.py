"""LoRA: training low-rank adapters (PEFT) on a frozen base model.

The learner wraps its model once, before the optimiser sees it; GRPO,
log-prob recompute and held-out scoring then run on the wrapped model as on
any other. What a LoRA version publishes is its adapter file
(``adapter_bytes``), an update against the base weights (``base_bytes``,
published once as a full version); ``protocol.models.updates`` says how nodes
rebuild the weights.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from safetensors.torch import save

from protocol.models.families import wire_dtype
from protocol.models.updates import lora_metadata

# --lora-targets: every linear layer of the decoder blocks (``linear_layers``).
ALL_LINEAR = "all-linear"

WIRE_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


@dataclass(frozen=True)
class LoraSettings:
    rank: int
    alpha: float
    dropout: float
    targets: tuple[str, ...]
    # B's standard deviation at the start (0: zeros, PEFT's own: the first
    # version is the base), drawn from ``init_seed`` so that every process
    # starts from the same adapter.
    init_scale: float = 0.0
    init_seed: int = 0

    @classmethod
    def from_config(cls, config, model: torch.nn.Module) -> LoraSettings | None:  # type: ignore[no-untyped-def]
        """The job's LoRA settings for ``model``; None when it trains every
        weight (``--lora 0``)."""
        if not config.lora:
            return None
        targets = tuple(t.strip() for t in config.lora_targets.split(",") if t.strip())
        if not targets:
            raise ValueError("--lora-targets names no layer")
        if targets == (ALL_LINEAR,):
            targets = linear_layers(model)
        return cls(
            config.lora,
            config.lora_alpha or 2.0 * config.lora,
            config.lora_dropout,
            targets,
            init_scale=config.lora_init_scale,
            init_seed=config.seed,
        )

    @classmethod
    def from_dict(cls, settings: dict) -> LoraSettings:
        """The settings ``as_dict`` wrote (a checkpoint's, the ranks')."""
        return cls(
            settings["rank"],
            settings["alpha"],
            settings["dropout"],
            tuple(settings["targets"]),
            init_scale=settings.get("init_scale", 0.0),  # checkpoints from before it: zeros
            init_seed=settings.get("init_seed", 0),
        )

    def as_dict(self) -> dict:
        return {
            "rank": self.rank,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "targets": list(self.targets),
            "init_scale": self.init_scale,
            "init_seed": self.init_seed,
        }


def adapter_of(settings: dict | None) -> dict | None:
    """What of ``LoraSettings.as_dict`` a checkpoint's adapter must match to
    be resumed (how it was first drawn no longer matters)."""
    return settings and {k: settings[k] for k in ("rank", "alpha", "dropout", "targets")}


def describe_lora(settings: dict | None) -> str:
    """How errors name a checkpoint's or a run's LoRA settings."""
    if not settings:
        return "every weight (no --lora)"
    return f"LoRA rank {settings['rank']} alpha {settings['alpha']:g} on {','.join(settings['targets'])}"


def published_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype a plain model's weights are published in: the model's own
    (``protocol.models.families.wire_dtype``), though the learner trains in float32."""
    return WIRE_DTYPES[wire_dtype(model.config.to_dict())]


def state_bytes(model: torch.nn.Module) -> bytes:
    """A plain (unwrapped) model's weights as safetensors bytes, in ``published_dtype``."""
    tied = getattr(model.config, "tie_word_embeddings", False)
    dtype = published_dtype(model)
    # Tied embeddings share storage and safetensors refuses shared tensors;
    # the receiver re-ties lm_head to the embedding.
    state = {
        k: v.detach().to("cpu", dtype).contiguous()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }
    return save(state)


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the policy as nodes run it, to verify their rollouts
    against: a plain model's weights rounded to ``published_dtype`` (and
    computed in float32 still). A LoRA model needs no rounding (its base came
    in that dtype and its adapter is published in float32), and its copies
    share the frozen base, which never changes: only the adapter is copied
    (a Qwen3-0.6B-shaped learner held 2.4 GB per version in the window)."""
    if hasattr(model, "peft_config"):
        base = {id(p): p for p in model.parameters() if not p.requires_grad}
        return copy.deepcopy(model, memo=base).eval().requires_grad_(False)
    frozen = copy.deepcopy(model).eval().requires_grad_(False)
    dtype = published_dtype(frozen)
    if dtype != torch.float32:
        with torch.no_grad():
            for p in frozen.parameters():
                p.copy_(p.to(dtype))
    return frozen


def linear_layers(model: torch.nn.Module) -> tuple[str, ...]:
    """The names of the linear layers in ``model``'s decoder blocks (every
    family's attention and MLP projections), in the model's order: what
    ``--lora-targets all-linear`` adapts, as PEFT's ``all-linear`` does (the
    output head excluded). Named, so that checkpoints and the adapter files
    nodes load say exactly which layers."""
    names: dict[str, None] = {}
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in f".{path}.":
            names.setdefault(path.rsplit(".", 1)[-1], None)
    if not names:
        raise ValueError("--lora-targets all-linear: the model has no linear layers in its decoder blocks")
    return tuple(names)


def wrap(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """``model`` with adapters on its ``settings.targets`` layers, everything else frozen.

    PEFT initialises B to zeros: the wrapped model computes exactly what the
    base does until the first step, unless ``settings.init_scale`` draws B
    at random (the same in every process).
    """
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in settings.targets if t not in present]
    if missing:
        raise ValueError(f"--lora-targets {','.join(missing)}: no such layer in the model")
    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.targets),
        bias="none",
    )
    wrapped = get_peft_model(model, config)
    if settings.init_scale:
        generator = torch.Generator().manual_seed(settings.init_seed)
        with torch.no_grad():
            for name, p in wrapped.named_parameters():
                if "lora_B" in name:
                    p.copy_(settings.init_scale * torch.randn(p.shape, generator=generator))
    return wrapped


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors, named as PEFT saves them (``...q_proj.lora_A.weight``)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in get_peft_model_state_dict(model).items()}


def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    if getattr(result, "unexpected_keys", None):
        raise ValueError(f"the checkpoint's adapter has tensors this model lacks: {result.unexpected_keys[:3]}")


def adapter_bytes(model: torch.nn.Module, settings: LoraSettings) -> bytes:
    """The adapter file a LoRA version publishes."""
    return save(adapter_state(model), metadata=lora_metadata(settings.rank, settings.alpha))


def restore(model: torch.nn.Module, state: dict) -> torch.nn.Module:
    """``model`` (the checkpoint's --model, freshly loaded) with a learner
    checkpoint's weights: its adapter merged in for a LoRA run (``export``,
    ``eval``), every weight otherwise."""
    settings = state.get("lora")
    if not settings:
        model.load_state_dict(state["model"])
        return model
    peft_model = wrap(model, LoraSettings.from_dict(settings))
    load_adapter_state(peft_model, state["model"])
    return peft_model
