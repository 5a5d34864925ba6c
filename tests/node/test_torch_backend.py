"""The torch backend's log-probs are those of the tokens it sampled, under
the model's raw logits at the job's temperature, for every family we support
(tests/families.py: sliding windows, softcapping, untied embeddings), taken
step by step into a static KV cache without keeping every step's logits."""

import pytest
import torch
from transformers import CompileConfig

from echo_learner.training.lora import state_bytes
from echo_learner.training.model import config_json
from echo_node.backend_torch import TorchBackend
from tests.families import COMMON, FAMILIES, tiny_model

STOP = COMMON["eos_token_id"]
NEW = 24  # past Gemma's window of 8 in tests/families.py


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_each_sampled_token_has_its_log_prob_under_the_raw_logits(family, temperature):
    model = tiny_model(family).eval()
    backend = TorchBackend(threads=1)
    backend.load(config_json(model), state_bytes(model))
    prompts = [(257, 97, 98), (257, 99, 100, 101, 102, 103, 104, 105, 106, 107)]  # unequal: left padding
    groups = backend.generate(prompts, 4, NEW, temperature, (STOP,))
    for prompt, group in zip(prompts, groups):
        assert len(group) == 4
        for sample in group:
            tokens = list(sample.tokens)
            assert 1 <= len(tokens) <= NEW and len(sample.logprobs) == len(tokens)
            assert STOP not in tokens[:-1]  # a sample ends after its first stop token
            with torch.no_grad():
                logits = model(torch.tensor([list(prompt) + tokens])).logits[0, len(prompt) - 1 : -1]
            expected = torch.log_softmax(logits.float() / temperature, dim=-1)
            expected = expected.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=1e-4), (prompt, tokens)
    backend.close()


def test_a_sample_ends_at_its_first_stop_token():
    model = tiny_model("llama").eval()
    with torch.no_grad():
        model.lm_head.weight[STOP] += 50 * model.lm_head.weight.abs().max()  # every step, STOP is likely
    backend = TorchBackend(threads=1)
    backend.load(config_json(model), state_bytes(model))
    samples = backend.generate([(257, 97)], 8, NEW, 1.0, (STOP,))[0]
    assert all(s.tokens[-1] == STOP and STOP not in s.tokens[:-1] for s in samples)
    assert min(len(s.tokens) for s in samples) < NEW
    backend.close()


def test_generation_never_compiles_even_where_transformers_would(monkeypatch):
    """transformers' generate compiles the decode step for a static cache on
    cuda, xpu and mps, recompiling for every new row count (a GPU node stalled
    for minutes, issue 71). Here it is told to compile on every device, the
    CPU too: the backend must still decode eagerly."""
    model = tiny_model("llama").eval()
    backend = TorchBackend(threads=1)
    backend.load(config_json(model), state_bytes(model))
    everywhere = CompileConfig()
    everywhere._compile_all_devices = True
    backend.model.generation_config.compile_config = everywhere

    def compile(*args, **kwargs):
        raise AssertionError("torch.compile reached through the torch backend")

    monkeypatch.setattr(torch, "compile", compile)
    for rows in (1, 3):  # a new row count: where a compiled decode step recompiles
        groups = backend.generate([(257, 97)] * rows, 2, 4, 1.0, ())
        assert [len(g) for g in groups] == [2] * rows
    backend.close()
