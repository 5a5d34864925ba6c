"""``echo-learner export``: a Hugging Face directory and a GGUF file, loaded by
transformers and by llama.cpp, give the same greedy answers."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from echo_learner.training import checkpoint
from echo_learner.training.model import load_model
from echo_node.backend_choice import llama_installed

pytestmark = pytest.mark.skipif(
    not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]' (make test does)"
)
PROMPTS = ([257, 97, 98, 99, 61], [257, 100, 99, 98, 97, 61], [257, 98, 61])
ANSWER_TOKENS = 8


def llama_greedy(llm, prompt):
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(ANSWER_TOKENS):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out


def test_the_exported_model_answers_alike_in_transformers_and_llama_cpp(tmp_path):
    import llama_cpp

    model, _ = load_model("", seed=3)
    torch.manual_seed(0)
    with torch.no_grad():
        # Weights far from the built-in initialisation (which answers "=" to
        # everything), so that each prompt gets its own answer.
        for weight in model.parameters():
            if weight.ndim == 2:
                weight.normal_(0.0, 0.5)
    data = tmp_path / "learner"
    data.mkdir()
    checkpoint.save(data / "checkpoint.pt", {"step": 7, "version": 7, "model_source": "", "model": model.state_dict()})
    out = tmp_path / "export"
    done = subprocess.run(
        [sys.executable, "-m", "echo_learner", "export", str(out), "--data-dir", str(data), "--gguf-dtype", "f32"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "exported step 7" in done.stdout
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    llm = llama_cpp.Llama(str(out / "model.gguf"), n_ctx=64, logits_all=True, verbose=False)
    answers = []
    for prompt in PROMPTS:
        with torch.no_grad():
            want = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=ANSWER_TOKENS,
                do_sample=False,
                min_new_tokens=ANSWER_TOKENS,
                pad_token_id=256,
            )[0, len(prompt) :].tolist()
        assert llama_greedy(llm, prompt) == want
        answers.append(want)
    assert len({tuple(a) for a in answers}) > 1  # the prompts matter: not one fixed answer
