"""``--backend auto|torch|llama``: what is chosen, why, and what a user is told."""

import pytest

from echo_node import backend
from echo_node.backend import BackendUnavailable, choose, llama_installed


def test_auto_falls_back_to_torch_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(backend, "llama_installed", lambda: False)
    chosen, why = choose("auto", "f32", 1, tmp_path)
    assert chosen.name == "torch" and "not installed" in why and "[llama]" in why


def test_asking_for_llama_without_it_explains_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(backend, "llama_installed", lambda: False)
    with pytest.raises(BackendUnavailable, match=r"pip install .*\[llama\]"):
        choose("llama", "f32", 1, tmp_path)


def test_torch_runs_f32_only(tmp_path):
    with pytest.raises(BackendUnavailable, match="f32 only"):
        choose("torch", "q8_0", 1, tmp_path)


@pytest.mark.skipif(not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]'")
def test_auto_prefers_llama_when_installed(tmp_path):
    chosen, why = choose("auto", "q8_0", 1, tmp_path)
    assert (chosen.name, chosen.dtype) == ("llama", "q8_0") and "installed" in why
