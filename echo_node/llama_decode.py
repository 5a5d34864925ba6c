"""One generate call on a llama.cpp context: continuous batching, with each
token sampled inside the decode graph.

**Sampling.** Every sequence gets its own sampler chain, ``temp(T)`` then
``dist(seed)``, attached to its sequence slot (``llama_set_sampler``).
llama.cpp then samples each output row inside ``llama_decode``, on the GPU
when there is one. The sample is drawn from softmax(logits / T) over the
whole vocabulary, with no truncation. We read back only the token and its
probability: the log of that probability is the log-prob the learner checks.
Before this, the whole logits row went to the host and numpy sampled it in
float64: 67 ms a step for 64 sequences of SmolLM2's vocabulary, which capped
the node at ~1,000 tokens/s whatever the GPU.

Each sequence's seed is derived from the call's seed and which sample it
is (prompt, member), never from its slot. The same seed therefore gives
the same samples however the sequences share the batch.

**Continuous batching.** Up to ``max_sequences`` sequences decode together,
one token each per step. A group's prompt is decoded once, except its last
token, in the same batch as the running sequences' tokens. Its cells are then
shared by the group's sequences (``llama_memory_seq_cp``), which join the next
step with the prompt's last token. When a sequence ends, its cells are freed
(``llama_memory_seq_rm``), and the next waiting group takes the slots as soon
as enough are free for all its sequences and the KV cache has room for the
whole group. ``continuous=False`` admits new groups only once every running
sequence has ended: that was the old chunked generation, kept as the
benchmark's baseline.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import time
from collections import deque
from dataclasses import dataclass, field

import llama_cpp
import numpy as np

from echo_node.backend import Sample


class DecodeError(RuntimeError):
    """llama.cpp could not decode a batch, or set a sampler."""


@dataclass
class Timing:
    """Where one call's time went: ``decode_s`` inside ``llama_decode`` (where
    the sampling now runs too), ``host_s`` everything else, over ``steps``
    decode steps."""

    steps: int = 0
    decode_s: float = 0.0
    host_s: float = 0.0


@dataclass
class _Sequence:
    prompt: int  # which prompt it continues
    member: int  # which of the group's samples it is
    slot: int  # its llama.cpp sequence id
    pos: int  # position of the token it decodes next
    next_token: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


def sequence_seed(seed: int, prompt: int, member: int) -> int:
    """The seed of one sample's sampler: the same whatever slot it runs in."""
    digest = hashlib.blake2b(f"{seed}:{prompt}:{member}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def cells_needed(prompt_len: int, group_size: int, max_new_tokens: int) -> int:
    """KV cells a group holds at most: its shared prompt and each sample's tokens."""
    return prompt_len + group_size * max_new_tokens


class Generation:
    def __init__(
        self,
        ctx: ctypes.c_void_p,
        *,
        n_ctx: int,
        max_sequences: int,
        prompts: list[tuple[int, ...]],
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        stop_ids: tuple[int, ...],
        seed: int,
        continuous: bool = True,
    ):
        if group_size > max_sequences:
            raise DecodeError(
                f"a group of {group_size} exceeds the {max_sequences} sequences llama.cpp decodes at once"
            )
        for p in prompts:
            if cells_needed(len(p), group_size, max_new_tokens) > n_ctx:
                raise DecodeError(
                    f"one prompt of {len(p)} tokens with {group_size} x {max_new_tokens} new tokens "
                    f"does not fit llama.cpp's context of {n_ctx}"
                )
        self.ctx = ctx
        self.memory = llama_cpp.llama_get_memory(ctx)
        self.n_ctx = n_ctx
        self.prompts = prompts
        self.group_size = group_size
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.stops = set(stop_ids)
        self.seed = seed
        self.continuous = continuous
        self.timing = Timing()
        self._waiting = deque(range(len(prompts)))
        self._free_slots = list(range(max_sequences - 1, -1, -1))
        self._cells = 0  # reserved by the groups admitted
        self._left = [group_size] * len(prompts)  # samples of each group still running
        self._running: list[_Sequence] = []
        self._joining: list[_Sequence] = []  # their prompt is decoded: they start next step
        self._done: dict[tuple[int, int], _Sequence] = {}
        self.max_sequences = max_sequences
        self._chains: list[ctypes.c_void_p] = []
        # A step holds the running sequences' tokens and the new groups'
        # prompts, all within the cells admitted: at most the context.
        self._batch = llama_cpp.llama_batch_init(n_ctx, 0, 1)

    def run(self) -> list[list[Sample]]:
        """Every prompt's ``group_size`` samples, in order; a sample ends
        after its first stop token (kept) or at ``max_new_tokens``."""
        llama_cpp.llama_memory_clear(self.memory, True)
        try:
            while self._waiting or self._running or self._joining:
                self._step()
        finally:
            self._detach()
        return [
            [Sample(tuple(self._done[p, m].tokens), tuple(self._done[p, m].logprobs)) for m in range(self.group_size)]
            for p in range(len(self.prompts))
        ]

    # --- one step ------------------------------------------------------------

    def _step(self) -> None:
        started = time.perf_counter()
        self._running.extend(self._joining)
        self._joining = []
        prefills = self._admit()
        entries = [(s.next_token, s.pos, s.slot, True) for s in self._running]
        for group in prefills:
            prompt = self.prompts[group[0].prompt]
            entries.extend((tok, pos, group[0].slot, False) for pos, tok in enumerate(prompt[:-1]))
        decode_s = self._decode(entries)
        # The groups' prompts are in the cache: share them with every sample.
        for group in prefills:
            for s in group[1:]:
                llama_cpp.llama_memory_seq_cp(self.memory, group[0].slot, s.slot, -1, -1)
            self._joining.extend(group)
        still = []
        for row, s in enumerate(self._running):
            token, logprob = self._drawn(row, s)
            s.tokens.append(token)
            s.logprobs.append(logprob)
            if token in self.stops or len(s.tokens) == self.max_new_tokens:
                self._finish(s)
            else:
                s.next_token, s.pos = token, s.pos + 1
                still.append(s)
        self._running = still
        self.timing.steps += 1
        self.timing.decode_s += decode_s
        self.timing.host_s += time.perf_counter() - started - decode_s

    def _admit(self) -> list[list[_Sequence]]:
        """Take waiting groups into free slots, as room allows; those whose
        prompt has more than one token are returned to prefill this step,
        the others join the running sequences at once."""
        if not self.continuous and (self._running or self._joining):
            return []
        prefills = []
        while self._waiting:
            p = self._waiting[0]
            prompt = self.prompts[p]
            need = cells_needed(len(prompt), self.group_size, self.max_new_tokens)
            if len(self._free_slots) < self.group_size or self._cells + need > self.n_ctx:
                break
            self._waiting.popleft()
            self._cells += need
            group = [
                _Sequence(prompt=p, member=m, slot=self._free_slots.pop(), pos=len(prompt) - 1, next_token=prompt[-1])
                for m in range(self.group_size)
            ]
            for s in group:
                self._attach(s)
            if len(prompt) > 1:
                prefills.append(group)
            else:
                self._running.extend(group)
        return prefills

    def _finish(self, s: _Sequence) -> None:
        llama_cpp.llama_memory_seq_rm(self.memory, s.slot, -1, -1)
        self._free_slots.append(s.slot)
        self._done[s.prompt, s.member] = s
        self._cells -= self.max_new_tokens
        self._left[s.prompt] -= 1
        if not self._left[s.prompt]:
            self._cells -= len(self.prompts[s.prompt])

    # --- llama.cpp -----------------------------------------------------------

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> float:
        """Decode ``(token, position, slot, sampled)`` entries as one batch;
        seconds spent in ``llama_decode``."""
        batch = self._batch
        for i, (tok, pos, slot, sampled) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = slot
            batch.logits[i] = sampled
        batch.n_tokens = len(entries)
        started = time.perf_counter()
        rc = llama_cpp.llama_decode(self.ctx, batch)
        if rc != 0:
            raise DecodeError(f"llama_decode failed with code {rc}")
        return time.perf_counter() - started

    def _drawn(self, row: int, s: _Sequence) -> tuple[int, float]:
        """The token sampled for output ``row`` (sequence ``s``) and its log-prob."""
        token = llama_cpp.llama_get_sampled_token_ith(self.ctx, row)
        return token, self._logprob(row, token)

    def _logprob(self, row: int, token: int) -> float:
        """log softmax(logits / T) of ``token``: the log of the probability
        the sampler drew it with, or, should that underflow, from the
        scaled logits themselves."""
        p = llama_cpp.llama_get_sampled_probs_ith(self.ctx, row)[token]
        if p > 0.0:
            return math.log(p)
        n = llama_cpp.llama_get_sampled_logits_count_ith(self.ctx, row)
        scaled = np.ctypeslib.as_array(llama_cpp.llama_get_sampled_logits_ith(self.ctx, row), shape=(n,))
        scaled = scaled.astype(np.float64)
        top = scaled.max()
        return float(scaled[token] - top - np.log(np.exp(scaled - top).sum()))

    def _attach(self, s: _Sequence) -> None:
        """A fresh sampler chain for ``s`` on its slot (a chain runs on one
        sequence only, and its random stream is this sample's)."""
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(self.temperature))
        llama_cpp.llama_sampler_chain_add(
            chain, llama_cpp.llama_sampler_init_dist(sequence_seed(self.seed, s.prompt, s.member))
        )
        self._chains.append(chain)
        if not llama_cpp.llama_set_sampler(self.ctx, s.slot, chain):
            raise DecodeError("llama.cpp could not sample on its backend")

    def _detach(self) -> None:
        """Take every chain off the context, then free them and the batch."""
        for slot in range(self.max_sequences):
            llama_cpp.llama_set_sampler(self.ctx, slot, None)
        for chain in self._chains:
            llama_cpp.llama_sampler_free(chain)
        self._chains = []
        llama_cpp.llama_batch_free(self._batch)
