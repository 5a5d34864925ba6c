"""Can the chosen backend load and decode a model on its GPU? Tried in a child process.

A GPU backend fails in ways the CPU never shows: a driver that does not match
the build, a build without kernels for this chip, two CUDA runtimes in one
process (llama.cpp crashed at model load on an H200 when torch had started
CUDA beside it, docs/inference.md). Such a failure kills the process (a
segmentation fault) before Python can say anything, and a stall looks like a
slow node. So before a node on a GPU joins, and in ``echo-node doctor``, a
child process loads a tiny model with the chosen backend on the chosen device
and decodes a few tokens: a crash, an error or a stall there is a finding,
told in one line with what the backend logged last and what to try instead.

    python -m echo_node.backend_trial llama f16 cuda     # the child; prints one JSON line
"""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TIMEOUT_S = 180.0  # a cold CUDA start and torch's import take tens of seconds, not minutes
LOG_PREFIX = "backend log: "  # the child's lines that are the backend's own log
# A tiny Llama (two layers, the built-in model's byte vocabulary), random
# weights: enough to reach every kernel a decode step uses.
TINY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 259,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "pad_token_id": 256,
    "bos_token_id": 257,
    "eos_token_id": 258,
}


@dataclass(frozen=True)
class Trial:
    ok: bool
    detail: str  # one line for people
    instead: str = ""  # what to try when it failed: "--backend torch or --device cpu"

    @property
    def line(self) -> str:
        return f"{self.detail}; try {self.instead}" if self.instead else self.detail


def random_llama(config: dict = TINY, seed: int = 0) -> tuple[str, bytes]:
    """A Llama of ``config``'s shape with random weights: its config.json
    text and safetensors bytes (numpy: no torch needed)."""
    from safetensors.numpy import save

    c, rng = config, np.random.default_rng(seed)
    hidden, kv = c["hidden_size"], c["num_key_value_heads"] * c["head_dim"]
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    for i in range(c["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        shapes |= {
            layer + "self_attn.q_proj.weight": (hidden, hidden),
            layer + "self_attn.k_proj.weight": (kv, hidden),
            layer + "self_attn.v_proj.weight": (kv, hidden),
            layer + "self_attn.o_proj.weight": (hidden, hidden),
            layer + "mlp.gate_proj.weight": (c["intermediate_size"], hidden),
            layer + "mlp.up_proj.weight": (c["intermediate_size"], hidden),
            layer + "mlp.down_proj.weight": (hidden, c["intermediate_size"]),
            layer + "input_layernorm.weight": (hidden,),
            layer + "post_attention_layernorm.weight": (hidden,),
        }
    weights = {
        name: np.ones(shape, np.float32) if len(shape) == 1 else rng.normal(0, 0.02, shape).astype(np.float32)
        for name, shape in shapes.items()
    }
    return json.dumps(c, sort_keys=True), save(weights)


def try_backend(backend: str, dtype: str, device: str, timeout_s: float = TIMEOUT_S) -> Trial:
    """Load and decode ``TINY`` with ``backend`` in ``dtype`` on ``device``, in a child process."""
    from echo_node.backend_choice import spec_of

    title = spec_of(backend).title
    started = time.monotonic()
    try:
        child = subprocess.run(
            [sys.executable, "-m", "echo_node.backend_trial", backend, dtype, device],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        said = _last_log_line(exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) else "")
        return Trial(
            False,
            f"{title} did not load and decode a tiny model on {device} within {timeout_s:.0f} s "
            f"(it stalled; its last log line: {said!r})",
            _instead(backend),
        )
    seconds = time.monotonic() - started
    if child.returncode == 0:
        seen = json.loads(child.stdout.strip().splitlines()[-1])
        return Trial(
            True,
            f"{title} loaded and decoded a tiny model on {seen['device']} "
            f"({seen['tokens']} tokens; {seconds:.1f} s with the process's start)",
        )
    if child.returncode < 0:
        what = f"crashed ({signal.Signals(-child.returncode).name})"
    else:
        lines = [line for line in child.stderr.splitlines() if line.startswith("error: ")]
        what = f"failed ({lines[-1].removeprefix('error: ') if lines else f'exit {child.returncode}'})"
    return Trial(
        False,
        f"{title} {what} loading and decoding a tiny model on {device}; "
        f"its last log line: {_last_log_line(child.stderr)!r}",
        _instead(backend),
    )


def _last_log_line(stderr: str) -> str:
    said = [line.removeprefix(LOG_PREFIX) for line in stderr.splitlines() if line.startswith(LOG_PREFIX)]
    return said[-1] if said else "none"


def _instead(backend: str) -> str:
    """The other installed backends, and the CPU."""
    from echo_node.backend_choice import specs

    others = [f"--backend {s.name}" for s in specs() if s.name != backend and s.installed()]
    return " or ".join([*others, "--device cpu"])


def main(argv: list[str]) -> int:
    """The child: load ``TINY``, decode 2 x 8 tokens, print one JSON line.
    The backend's log goes to stderr as it comes (``LOG_PREFIX``), so that
    its last line survives a crash; so does a crash's Python traceback."""
    from echo_node.backend_choice import BackendUnavailable, choose

    backend_name, dtype, device = argv
    faulthandler.enable()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_PREFIX + "%(message)s"))
    for name in ("echo_node.backend_llama", "transformers"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.DEBUG)
    with tempfile.TemporaryDirectory(prefix="echo-trial-") as work_dir:
        try:
            backend, _ = choose(backend_name, dtype, 1, Path(work_dir), device)
            config_json, weights = random_llama()
            started = time.monotonic()
            backend.load(config_json, weights)
            loaded = time.monotonic()
            groups = backend.generate([(257, 97, 98, 99)], 2, 8, 1.0, ())
            decoded = time.monotonic()
            backend.close()
        except (BackendUnavailable, ValueError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(
        json.dumps(
            {
                "device": backend.device.name,
                "tokens": sum(len(s.tokens) for g in groups for s in g),
                "load_s": round(loaded - started, 3),
                "decode_s": round(decoded - loaded, 3),
                "torch_imported": "torch" in sys.modules,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
