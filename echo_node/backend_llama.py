"""Rollouts with llama.cpp: exact temperature sampling over raw logits.

llama.cpp's default samplers are made for chat (temperature 0.8, top-k 40,
top-p 0.95, min-p 0.05): they truncate the distribution, so the tokens would
not come from the policy the learner trains and the log-probs would be wrong.
We sample with temperature and ``dist`` only: each token is drawn from
softmax(logits / T) over the whole vocabulary, inside llama.cpp's decode
graph, and its log-prob is that distribution's (``echo_node.llama_decode``,
which also batches the sequences of every group continuously).

This module loads versions: a GGUF per version (exported here, or the
learner's q8_0 variant), LoRA adapters on a base loaded once, and a context
per version.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from echo_node.backend import BackendSpec, Sample
from echo_node.device import Device, cpu
from echo_node.memory import Need, kv_bytes_per_token
from echo_node.model_shape import ModelShape
from protocol.models import updates
from protocol.models.gguf_export import f32_tensors, write_gguf
from protocol.models.gguf_lora import write_lora_gguf
from protocol.process.files import write_atomic

if TYPE_CHECKING:
    from echo_node.llama_decode import Timing

# Sequences decoded together. With a unified KV cache every token attends over
# the cells of all sequences (masked), so very wide batches get slower on a
# CPU: on the built-in model 256 sequences ran at ~0.5x the tokens/s of 32-64.
MAX_SEQUENCES = 64
LLAMA_CELLS = 4096  # the context: KV cells shared by one call's sequences
# On a GPU a decode step costs about the same for 16 sequences as for 256, so
# a node decodes as many as llama.cpp allows (LLAMA_MAX_SEQ), in a context
# sized to the GPU's memory (echo_node.memory.gpu_cells) up to 256 sequences
# of 256 tokens: 4,096 cells held one group of 16 x 128 new tokens at a time.
GPU_MAX_SEQUENCES = 256
GPU_CELLS = 65536
UBATCH = 512  # tokens llama.cpp computes at once (n_ubatch)
GGML_TYPE_F32 = 0
FLASH_ATTN_DISABLED = 0
GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT = 3, 4, 5

log = logging.getLogger(__name__)  # llama.cpp's own log, at DEBUG: shown with -v
# llama.cpp's last log lines (level, text): what it said before a load
# failed, for the one line the node prints then.
recent_log: deque[tuple[int, str]] = deque(maxlen=64)


def installed() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "gguf"))


# The ``llama`` extra is optional: without it this module still says what
# the backend is (``SPEC``), and that it is not installed.
if installed():
    import llama_cpp

    from echo_node import llama_devices

    @llama_cpp.llama_log_callback
    def _forward_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        # llama.cpp prints its load log and harmless warnings (e.g. our 4096-cell
        # context exceeds the tiny model's 64 training positions, which is total
        # cells for all sequences, not one sequence's length) to stderr; keep them
        # for -v only, and the last few for when a load fails.
        line = text.decode("utf-8", "replace").rstrip()
        if level == GGML_LOG_LEVEL_CONT and recent_log:  # more of the line before (progress dots)
            before = recent_log.pop()
            recent_log.append((before[0], before[1] + line))
        elif line:
            recent_log.append((level, line))
            log.debug("%s", line)

    llama_cpp.llama_log_set(_forward_log, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()


def last_words() -> str:
    """What llama.cpp said last that matters: its last error, else its last
    warning, else its last line."""
    for wanted in (GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_WARN, None):
        for level, line in reversed(recent_log):
            if wanted is None or level == wanted:
                return line
    return "nothing"


def gpu_kinds() -> list[str]:
    """The GPU kinds the installed llama.cpp can offload to, best first."""
    return llama_devices.gpu_kinds() if installed() else []


def no_gpu(kind: str) -> str:
    found = gpu_kinds()
    if found:
        return f"the installed llama.cpp offloads to {', '.join(found)}, not {kind}"
    return (
        "the installed llama.cpp was built without GPU offload: reinstall llama-cpp-python with "
        "CMAKE_ARGS=-DGGML_CUDA=on (or -DGGML_METAL=on, -DGGML_VULKAN=on; README, 'A gaming PC')"
    )


def call_need(shape: ModelShape, sequences: int, prompt_tokens: int, new_tokens: int) -> Need:
    # The KV cache came with the model; llama.cpp's output buffer holds, per
    # sampled row, the scaled logits, the probabilities (f32) and the
    # candidate ids (int32) of the whole vocabulary (echo_node/llama_decode.py).
    return Need(buffers=sequences * shape.vocab * (4 + 4 + 4))


def cell_bytes(shape: ModelShape) -> int:
    """What one context cell costs: its f32 key and value in every layer and,
    without flash attention, one ubatch's attention scores over it (every
    head's, and the mask): 10 KiB a cell for 4 heads, 6 for 2, measured on
    the CPU build's compute buffer."""
    return kv_bytes_per_token(shape) + UBATCH * 4 * (shape.heads + 1)


def report() -> str:
    gpus = ", ".join(f"{d.kind} ({d.name})" for d in llama_devices.gpu_devices())
    offload = f"GPU offload: {gpus}" if gpus else "CPU only: built without GPU offload"
    return f"llama.cpp {importlib.metadata.version('llama-cpp-python')} ({offload})"


SPEC = BackendSpec(
    name="llama",
    title="llama.cpp",
    dtypes=("f32", "f16", "q8_0"),
    auto_dtypes=("f32", "f16", "q8_0"),
    installed=installed,
    install=(
        'llama.cpp is not installed: pip install "echo-swarm[llama]" (from the repository: '
        "pip install -e '.[llama]'; it builds llama.cpp, which takes a few minutes)"
    ),
    gpu_kinds=gpu_kinds,
    gpu=lambda kind: llama_devices.gpu(kind),
    no_gpu=no_gpu,
    report=report,
    converted_bytes=4,  # the GGUF export widens every tensor to f32 first
    kv_cells=LLAMA_CELLS,
    merges_lora=False,
    offloads_layers=True,
    call_need=call_need,
    gpu_cells=GPU_CELLS,
    cell_bytes=cell_bytes,
    make=lambda dtype, threads, work_dir, device: LlamaBackend(dtype, threads, work_dir, device),
)


class LlamaError(RuntimeError):
    """llama.cpp could not load a version or decode a batch."""


@dataclass
class Model:
    """A loaded GGUF, shared by the versions that run on it (a LoRA base
    serves every adapter made against it); freed with its last user."""

    path: Path
    handle: ctypes.c_void_p
    key: bytes = b""  # a LoRA base: its manifest digest
    users: int = 0

    def release(self) -> None:
        self.users -= 1
        if self.users == 0:
            llama_cpp.llama_model_free(self.handle)  # and the adapters made for it
            self.path.unlink(missing_ok=True)


@dataclass
class Loaded:
    """One policy version, loaded: a llama.cpp model, a context on it, and
    for a LoRA version the adapter set on that context."""

    model: Model
    ctx: ctypes.c_void_p
    n_vocab: int
    n_ctx: int
    adapter: ctypes.c_void_p | None = None

    def free(self) -> None:
        llama_cpp.llama_free(self.ctx)
        if self.adapter is not None:
            llama_cpp.llama_adapter_lora_free(self.adapter)
        self.model.release()


class LlamaBackend:
    spec = SPEC
    name = SPEC.name

    def __init__(
        self, dtype: str, threads: int, work_dir: Path, device: Device | None = None, context: int = LLAMA_CELLS
    ):
        # auto: the node picks the most exact dtype that fits once it knows
        # the job's model (echo_node.memory.choose_dtype), before the first prepare.
        self.auto_dtype = dtype == "auto"
        self.dtype = "f32" if self.auto_dtype else dtype
        self.device = device or cpu()
        # Layers offloaded to the GPU: all (-1) on a GPU, unless the node
        # finds fewer fit (echo_node.memory.gpu_layers); none on the CPU.
        self.gpu_layers = -1 if self.device.gpu else 0
        self.threads = threads
        self.work_dir = work_dir
        # KV cells shared by all sequences of one batch (a node on a GPU
        # sizes them to its memory first: echo_node.memory.fit_backend).
        self.kv_cells = context
        self.max_sequences = GPU_MAX_SEQUENCES if self.device.gpu else MAX_SEQUENCES  # decoded together
        self.loaded: Loaded | None = None
        self._base: Model | None = None  # the LoRA base model versions' adapters apply to
        self.prepared = 0  # numbers the files: a version never overwrites the one in use
        # Sampling seeds come from OS entropy (samples must not be
        # predictable) unless a test fixes them.
        self.seed: int | None = None
        self.timing: Timing | None = None  # of the last generate call
        # Files a previous run left (killed before it could delete them).
        for stale in work_dir.glob("policy-*.gguf*"):
            stale.unlink()

    @property
    def variant(self) -> str:
        """A q8_0 node runs the q8_0 GGUF the learner publishes of a base
        (1.06 bytes a weight on the wire, and no export here)."""
        return updates.Q8_GGUF if self.dtype == "q8_0" else ""

    def prepare(self, config_json: str, weights: bytes, digest: bytes = b"", variant: str = "") -> Loaded:
        """Export ``weights`` as a GGUF in this node's dtype and load it (or,
        given its ``variant``, load that GGUF as it is). ``digest`` (SHA-256
        of ``weights``) names the model, so that LoRA versions made against
        these very weights use it as their base."""
        model = self._load_model(config_json, weights, variant)
        model.key = digest
        return self.new_context(model)

    def prepare_lora(
        self,
        config_json: str,
        base_key: bytes,
        base_weights: Callable[[], bytes],
        adapter: bytes,
        base_variant: str = "",
        limits: updates.UpdateLimits = updates.UpdateLimits(),
    ) -> Loaded:
        """A LoRA version: its adapter (safetensors, ``protocol.models.updates``) as a
        llama.cpp adapter on the base model, loaded once per base
        (``base_weights`` is called only then). 0.14 s a version for
        SmolLM2-135M where merging and exporting the whole model takes 1.2 s
        (bench/lora_gguf.py). ``base_key``: the SHA-256 of the base's
        weights; the version in use is the base itself when it is the base
        version, and is not loaded twice (a Qwen3-0.6B-shaped q8_0 node
        peaked at 9 GiB, killed, when it was). ``base_variant``: the base
        comes as that variant (``prepare``). ``UpdateRefused`` for an adapter
        beyond ``limits``, before anything is loaded; llama.cpp refuses one
        whose matrices do not fit the base's (``LlamaError``)."""
        checked = updates.check_adapter(adapter, limits)
        base = self._base if self._base is not None and self._base.key == base_key else None
        if base is None and self.loaded is not None and self.loaded.model.key == base_key:
            base = self.loaded.model
            if self._base is not None:
                self._base.release()
            base.users += 1  # held by the backend until another base replaces it
            self._base = base
        if base is None:
            base = self._load_model(config_json, base_weights(), base_variant)
            base.key = base_key
            if self._base is not None:
                self._base.release()
            base.users += 1  # held by the backend until another base replaces it
            self._base = base
        self.prepared += 1
        path = self.work_dir / f"policy-{self.prepared}-lora.gguf"
        write_lora_gguf(config_json, f32_tensors(adapter), checked.alpha, path)
        recent_log.clear()
        lora = llama_cpp.llama_adapter_lora_init(base.handle, str(path).encode())
        path.unlink()  # llama.cpp has read it into its own buffers
        if not lora:
            raise self._error("load the LoRA adapter")
        loaded = self.new_context(base)
        loaded.adapter = lora
        if (
            llama_cpp.llama_set_adapters_lora(
                loaded.ctx, (llama_cpp.llama_adapter_lora_p_ctypes * 1)(lora), 1, (ctypes.c_float * 1)(1.0)
            )
            != 0
        ):
            loaded.free()
            raise self._error("set the LoRA adapter")
        return loaded

    def _load_model(self, config_json: str, weights: bytes, variant: str = "") -> Model:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.prepared += 1
        path = self.work_dir / f"policy-{self.prepared}-{self.dtype}.gguf"
        if variant and variant != self.variant:
            raise ValueError(f"a {self.dtype} node runs no {variant} files")
        if variant:
            write_atomic(path, weights)
        else:
            write_gguf(config_json, f32_tensors(weights), path, self.dtype)
        return self.load_file(path)

    def load_file(self, path: Path) -> Model:
        """The GGUF at ``path``, loaded on this backend's device (the model
        deletes the file when it is freed)."""
        recent_log.clear()  # what it says from here is about this load
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = self.gpu_layers
        # No repacked weight layouts (AMX, CPU_REPACK): on Sapphire Rapids CPUs
        # (AMX_INT8) the AMX buffer segfaults in its first q8_0 matmul
        # (tests/node/test_llama_backend.py; llama.cpp #20824).
        model_params.use_extra_bufts = False
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        if not model:
            path.unlink(missing_ok=True)
            raise self._error(f"load {path.name}")
        return Model(path, model)

    def new_context(self, model: Model) -> Loaded:
        """A context to generate with on ``model`` (which it then holds)."""
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = self.kv_cells
        params.n_ubatch = min(self.kv_cells, UBATCH)
        params.n_seq_max = self.max_sequences
        params.kv_unified = True  # the group's sequences share their prompt's cells
        params.n_threads = params.n_threads_batch = self.threads
        # An f32 KV cache without flash attention, whatever the weights' dtype:
        # llama.cpp's default f16 cache alone put f32 weights 0.016-0.02 away
        # from the learner's recompute on trained models (3e-5 with f32).
        params.type_k = params.type_v = GGML_TYPE_F32
        params.flash_attn_type = FLASH_ATTN_DISABLED
        model.users += 1
        recent_log.clear()
        ctx = llama_cpp.llama_init_from_model(model.handle, params)
        if not ctx:
            model.release()
            raise self._error("create a context")
        n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model.handle))
        return Loaded(model, ctx, n_vocab, llama_cpp.llama_n_ctx(ctx))

    def _error(self, what: str) -> LlamaError:
        """``what`` failed: one line with llama.cpp's last words and what to try instead."""
        instead = "--device cpu or --backend torch" if self.device.gpu else "--backend torch"
        return LlamaError(f"llama.cpp could not {what} on {self.device.name}: {last_words()} (try {instead})")

    def use(self, loaded: Loaded) -> None:
        """Generate with ``loaded`` from now on; free the version it replaces."""
        old, self.loaded = self.loaded, loaded
        if old is not None:
            old.free()

    def load(self, config_json: str, weights: bytes) -> None:
        self.use(self.prepare(config_json, weights))

    def close(self) -> None:
        if self.loaded is not None:
            self.loaded.free()
            self.loaded = None
        if self._base is not None:
            self._base.release()
            self._base = None

    def generate(
        self,
        prompts: list[tuple[int, ...]],
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        stop_ids: tuple[int, ...],
    ) -> list[list[Sample]]:
        """``group_size`` samples per prompt, each with its tokens' log-probs
        (``echo_node.llama_decode``: continuous batching, each token sampled
        in the decode graph); a sample ends after its first stop token, which
        it keeps."""
        from echo_node.llama_decode import DecodeError, Generation

        assert self.loaded is not None, "load weights before generating"
        generation = Generation(
            self.loaded.ctx,
            n_ctx=self.loaded.n_ctx,
            max_sequences=self.max_sequences,
            prompts=prompts,
            group_size=group_size,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stop_ids=stop_ids,
            seed=self.seed if self.seed is not None else secrets.randbits(32),
        )
        try:
            samples = generation.run()
        except DecodeError as exc:
            raise LlamaError(str(exc)) from exc
        self.timing = generation.timing
        return samples
