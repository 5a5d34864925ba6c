"""``echo-learner export``: the newest checkpoint's model as a Hugging Face
directory (with its tokenizer; a LoRA run's adapter too) and as a llama.cpp
GGUF file."""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from typing import Any

from protocol.process.config import fail


def command(args: argparse.Namespace, prog: str) -> None:
    if args.out.exists() and any(args.out.iterdir()):
        fail(prog, f"{args.out} exists and is not empty")

    from echo_learner.training import checkpoint
    from echo_learner.training.model import ModelError, load_model

    started = time.monotonic()
    try:
        state = checkpoint.load(args.data_dir / "checkpoint.pt")
    except checkpoint.CheckpointError as exc:
        fail(prog, str(exc))
    try:
        model, tokenizer = load_model(state.get("model_source", ""))
    except ModelError as exc:
        fail(prog, f"cannot rebuild the checkpoint's model: {exc}")
    from echo_learner.training.lora import restore

    model = restore(model, state)
    args.out.mkdir(parents=True, exist_ok=True)
    if state.get("lora"):
        # The adapter on its own (PEFT's format), then the merged model.
        model.save_pretrained(args.out / "adapter")
        model = model.merge_and_unload()
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    if importlib.util.find_spec("gguf") is None:
        print("no GGUF file written: the gguf package is missing (pip install 'echo-swarm[llama]')", flush=True)
    else:
        write_model_gguf(model, state.get("model_source", ""), args.out / "model.gguf", args.gguf_dtype)
    print(
        f"exported step {state['step']} (version {state['version']}) to {args.out} "
        f"in {time.monotonic() - started:.1f} s",
        flush=True,
    )


def write_model_gguf(model: Any, source: str, path: Path, dtype: str) -> None:
    """``model`` as a llama.cpp GGUF file, with the tokenizer of ``source``'s
    GGUF file if it came from one (else the byte vocabulary nodes use)."""
    from echo_learner.training.model import config_json, locate
    from protocol.models.gguf_export import write_gguf

    where = locate(source) if source else {}
    tokenizer_from = None
    if "gguf_file" in where:
        tokenizer_from = Path(where["pretrained_model_name_or_path"]) / where["gguf_file"]
    tied = getattr(model.config, "tie_word_embeddings", False)
    tensors = {
        name: value.detach().float().numpy()
        for name, value in model.state_dict().items()
        if not (tied and name == "lm_head.weight")  # llama.cpp ties it back itself
    }
    write_gguf(config_json(model), tensors, path, dtype, tokenizer_from=tokenizer_from)
