"""Rollouts with torch: exact temperature sampling, raw log-probs of every sampled token."""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
from safetensors.torch import load
from transformers import (
    CONFIG_MAPPING,
    AutoModelForCausalLM,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    StaticCache,
)

from echo_node.backend import BackendSpec, Sample
from echo_node.device import Device, cpu, ram_usage
from echo_node.memory import Need, kv_bytes_per_token
from echo_node.model_shape import ModelShape
from protocol.models import updates
from protocol.models.families import family_of

TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def gpu_kinds() -> list[str]:
    """GPU kinds the installed torch can run on, best first."""
    kinds = []
    if torch.cuda.is_available():
        kinds.append("cuda")
    if torch.backends.mps.is_available():
        kinds.append("mps")
    return kinds


def cuda_usage() -> tuple[int, int]:
    return int(torch.cuda.mem_get_info()[0]), int(torch.cuda.memory_reserved())


def gpu(kind: str) -> Device:
    """The GPU of ``kind`` with its free memory."""
    if kind == "cuda":
        return Device("cuda", torch.cuda.get_device_name(), cuda_usage()[0], usage=cuda_usage)
    # Apple GPUs share the RAM: what torch may still allocate there.
    limit = torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory()
    return Device("mps", "Apple GPU (Metal)", max(0, int(limit)), usage=ram_usage)


def auto_dtype(device: Device) -> str:
    """f32 on the CPU (half-precision matmuls are slower there, not faster);
    on a GPU bf16 where it has it (less exact than f16, but it never
    overflows), else f16."""
    if device.kind == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "f16"
    return "f16" if device.kind == "mps" else "f32"


def no_gpu(kind: str) -> str:
    if kind == "vulkan":
        return "torch does not run on Vulkan (use --backend llama with a Vulkan build of llama.cpp)"
    needs = "a CUDA build of torch and an NVIDIA driver" if kind == "cuda" else "a Mac with Apple silicon"
    return f"torch cannot use {kind} here: it needs {needs} (README, 'A gaming PC')"


def call_need(shape: ModelShape, sequences: int, prompt_tokens: int, new_tokens: int) -> Need:
    # Each call's own static cache, sized to it (TorchBackend.generate).
    cache = kv_bytes_per_token(shape) * sequences * (prompt_tokens + new_tokens)
    # Nothing is kept across steps (_SampledLogprobs), but one step's logits
    # live in several copies at once (the model's output, generate's f32
    # copy, the temperature warper's, the sampler's, our log-softmax): 6.3
    # of them at the peak (tests/node/test_memory.py), up to 10.6 where
    # glibc's heap kept freed ones, so 12.
    logits = sequences * shape.vocab * 4 * 12
    # A layer's attention may copy its keys and values: the same test saw
    # up to 1.3 layers' share of the cache over the cache itself on glibc's
    # heap, so 2.
    attention = 2 * cache // shape.layers
    return Need(cache=cache, buffers=logits + attention)


SPEC = BackendSpec(
    name="torch",
    title="torch",
    dtypes=tuple(TORCH_DTYPES),
    auto_dtypes=("f32",),  # on the CPU; a GPU's auto dtype is auto_dtype(device)'s
    installed=lambda: True,  # a dependency of the node itself
    install="",
    gpu_kinds=gpu_kinds,
    gpu=gpu,
    no_gpu=no_gpu,
    report=lambda: f"torch {torch.__version__} ({', '.join(gpu_kinds()) or 'CPU only'})",
    converted_bytes=None,  # tensors load as published
    kv_cells=0,
    merges_lora=True,
    offloads_layers=False,
    call_need=call_need,
    smaller=" (llama.cpp runs it smaller: --backend llama --dtype auto)",
    make=lambda dtype, threads, work_dir, device: TorchBackend(threads, device, dtype),
)


class TorchBackend:
    spec = SPEC
    name = SPEC.name
    auto_dtype = False  # the dtype follows the device (auto_dtype()), not free memory
    variant = ""  # it runs bases as published
    kv_cells = 0  # its KV cache is each generate call's own

    def __init__(self, threads: int, device: Device | None = None, dtype: str = "auto"):
        torch.set_num_threads(threads)
        self.device = device or cpu()
        # The learner knows each (backend, dtype, device)'s rounding and
        # allows for it (echo_learner/verify/tolerance.py); the log-probs nodes
        # report come from the logits in this dtype.
        self.dtype = auto_dtype(self.device) if dtype == "auto" else dtype
        self._torch_dtype = TORCH_DTYPES[self.dtype]
        self._torch_device = torch.device(self.device.kind)
        if self.device.kind == "cuda":
            # TF32 matmuls would put log-probs ~1e-3 away from the learner's f32.
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.model: PreTrainedModel | None = None
        # Double buffering: a new version loads into the spare model while
        # generation goes on with the current one; ``use`` swaps them.
        self._spare: PreTrainedModel | None = None
        # A LoRA job's base: its tensors as published, and whose they are.
        self._base_state: dict[str, torch.Tensor] = {}
        self._base_key = b""

    def prepare(self, config_json: str, weights: bytes, digest: bytes = b"", variant: str = "") -> PreTrainedModel:
        """A model holding safetensors ``weights`` (in whatever dtype they
        travelled), built from ``config_json`` in this node's dtype (safe to
        call while ``generate`` runs). ``digest`` is not needed here."""
        if variant:
            raise ValueError(f"the torch backend runs no {variant} files")
        return self._build(config_json, load(weights))

    def prepare_lora(
        self,
        config_json: str,
        base_key: bytes,
        base_weights: Callable[[], bytes],
        adapter: bytes,
        base_variant: str = "",
        limits: updates.UpdateLimits = updates.UpdateLimits(),
    ) -> PreTrainedModel:
        """A LoRA version: the base's tensors (loaded once per base, kept as
        they travelled) with the adapter merged in, straight into a model.
        Rebuilding the merged weights as a file and loading that held three
        more copies of the weights (a Qwen3-0.6B-shaped f32 node was
        OOM-killed at 11 GB). ``UpdateRefused`` for an adapter beyond
        ``limits`` or that does not fit the base, before anything is merged."""
        if base_variant:
            raise ValueError(f"the torch backend runs no {base_variant} files")
        if self._base_key != base_key:
            self._base_state, self._base_key = {}, b""  # the old base's memory first
            self._base_state, self._base_key = load(base_weights()), base_key
        return self._build(config_json, updates.merged_lora(self._base_state, adapter, limits))

    def _build(self, config_json: str, state: dict[str, torch.Tensor]) -> PreTrainedModel:
        settings = json.loads(config_json)
        config = CONFIG_MAPPING[family_of(settings).model_type].from_dict(settings)
        config.dtype = self._torch_dtype  # as the built model's config says
        model = self._spare
        if model is None or model.config.to_dict() != config.to_dict():
            model = AutoModelForCausalLM.from_config(config, dtype=self._torch_dtype)
            model = model.to(self._torch_device).eval()
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = getattr(model.config, "tie_word_embeddings", False)
        if unexpected or set(missing) - ({"lm_head.weight"} if tied else set()):
            raise ValueError(f"weights do not fit the model: missing={missing} unexpected={unexpected}")
        if tied:
            model.tie_weights()
        return model

    def use(self, model: PreTrainedModel) -> None:
        """Generate with ``model`` from now on (never call during ``generate``)."""
        self._spare, self.model = self.model, model

    def load(self, config_json: str, weights: bytes) -> None:
        self.use(self.prepare(config_json, weights))

    def close(self) -> None:
        self.model = self._spare = None
        self._base_state, self._base_key = {}, b""

    @torch.no_grad()
    def generate(
        self,
        prompts: list[tuple[int, ...]],
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        stop_ids: tuple[int, ...],
    ) -> list[list[Sample]]:
        """``group_size`` samples per prompt, each with its tokens' log-probs.

        Sampling is plain temperature sampling over the full vocabulary (no
        top-k, top-p or min-p: RL needs the true behaviour distribution); a
        sample ends after its first stop token, which it keeps.
        """
        assert self.model is not None, "load weights before generating"
        pad = self.model.config.pad_token_id or 0
        rows = [p for p in prompts for _ in range(group_size)]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for i, r in enumerate(rows):  # left padding, as generation needs
            input_ids[i, width - len(r) :] = torch.tensor(r)
            attention[i, width - len(r) :] = 1
        sampled = _SampledLogprobs(temperature, len(rows), max_new_tokens, self._torch_device)
        # A static cache of this call's own size: generate's own
        # (cache_implementation="static") is kept on the model and never
        # shrinks, so a call with more rows after a longer one held rows x
        # the longest length seen (64 x 1,000 tokens: 533 MB where this call
        # needs 31, tests/node/test_memory.py). Allocated once, unlike a
        # dynamic cache that is copied as it grows.
        cache = StaticCache(config=self.model.config, max_cache_len=width + max_new_tokens)
        sequences = self.model.generate(
            input_ids=input_ids.to(self._torch_device),
            attention_mask=attention.to(self._torch_device),
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=list(stop_ids),
            pad_token_id=pad,
            logits_processor=LogitsProcessorList([sampled]),
            cache=cache,
            # generate compiles the decode step for a static cache on cuda,
            # xpu and mps (CUDA graphs): a new compile for each new row count
            # and new graphs for each new cache, which stalled a GPU node
            # for minutes (docs/inference.md); eager decoding ran at 1.04 x a
            # bare KV-cache loop there.
            disable_compile=True,
        )
        new = sequences[:, width:].cpu()
        logprobs = sampled.finish(sequences).cpu()
        samples = []
        for toks, lps in zip(new.tolist(), logprobs.tolist()):
            end = len(toks)
            for j, t in enumerate(toks):
                if t in stop_ids:
                    end = j + 1
                    break
            samples.append(Sample(tuple(toks[:end]), tuple(lps[:end])))
        return [samples[i * group_size : (i + 1) * group_size] for i in range(len(prompts))]


class _SampledLogprobs(LogitsProcessor):
    """Each sampled token's log-prob under the raw logits at ``temperature``,
    taken as generation goes.

    transformers' ``output_logits`` would keep every step's logits until the
    end (sequences x new tokens x vocabulary floats: gigabytes for a 150k
    vocabulary); this keeps one step's log-softmax and one float per token.
    Passed to ``generate``, it runs before the temperature warper, on the
    model's raw logits. A step's sampled token is read at the next call (the
    last one in ``finish``), where it is the last column of ``input_ids``.
    """

    def __init__(self, temperature: float, rows: int, max_new_tokens: int, device: torch.device) -> None:
        self.temperature = temperature
        self.step: torch.Tensor | None = None
        # One tensor for every step's picks, allocated before the loop: a
        # small tensor kept per step landed in the hole the step's freed
        # logits left, so the next step's logits went to fresh memory (peak
        # RSS up to 2.2x the KV cache in 3 of 46 runs, tests/node/test_memory.py).
        self.picked = torch.zeros(rows, max_new_tokens, device=device)
        self.steps = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._pick(input_ids)
        self.step = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """The log-probs of every generated token, one row per sequence."""
        self._pick(sequences)
        return self.picked[:, : self.steps]

    def _pick(self, input_ids: torch.Tensor) -> None:
        if self.step is not None:
            self.picked[:, self.steps] = self.step.gather(-1, input_ids[:, -1:]).squeeze(-1)
            self.steps += 1
            self.step = None
