"""A new policy version as a LoRA adapter: merge and re-export, or load the adapter?

A llama.cpp node holds the base model (SmolLM2-135M-Instruct) and receives
each policy version as a PEFT LoRA adapter (rank 16 on q/k/v/o/gate/up/down).
Two ways to get it running, timed per version from the adapter tensors in hand
to a context ready to generate:

  merge    ``protocol.models.updates.merge_lora`` (W += (alpha/r) * B @ A, f32, the
           full safetensors bytes), then the node's ``LlamaBackend.prepare``
           (GGUF export in the node's dtype, model load, context) and ``use``
           (frees the old one): what a node did before adapters
  adapter  the node's ``LlamaBackend.prepare_lora``: the base GGUF exported
           and loaded once (``base_export_load_s``); per version the adapter
           written as a GGUF adapter, loaded, and set on a fresh context of
           the same model; ``use`` frees the previous version

Median of 3 versions each, after a warm-up version, for f32 (what
``--dtype auto`` picks for this model when it fits) and q8_0. The same
versions are decoded by both contexts (``switch_max_abs_dlogprob``: every
version, each adapter on a fresh context of the one base model), and rollout speed with
each (``decode_tok_s``: the adapter adds its low-rank matmuls to every token).

Correctness at f32 with the high-level ``llama_cpp.Llama`` (``logits_all``,
f32 KV cache): max |d log-prob| over a ~20-token prompt between the merged
GGUF, the base GGUF + ``lora_path`` and HF + PEFT in torch.

    python bench/lora_gguf.py --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402
import peft  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load  # noqa: E402
from safetensors.torch import save  # noqa: E402

from echo_learner.training.lora import state_bytes  # noqa: E402
from echo_learner.training.model import config_json, load_model  # noqa: E402
from echo_node.backend_llama import GGML_TYPE_F32, LlamaBackend  # noqa: E402
from echo_node.device import default_threads  # noqa: E402
from protocol.models.gguf_export import write_gguf  # noqa: E402
from protocol.models.gguf_lora import write_lora_gguf  # noqa: E402
from protocol.models.updates import lora_metadata, merge_lora  # noqa: E402

RANK, ALPHA = 16, 32
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = "The quick brown fox jumps over the lazy dog, and then it runs into the forest to find"


def random_adapter(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """New random lora_A / lora_B values in ``model`` (a PEFT model); its
    adapter as PEFT saves it."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            elif "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
    return {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(model).items()}


def adapter_file(adapter: dict[str, torch.Tensor]) -> bytes:
    """The adapter as a LoRA version ships it (``protocol.models.updates``)."""
    return save(adapter, metadata=lora_metadata(RANK, ALPHA))


def prompt_logprobs(backend: LlamaBackend, ids: list[int]) -> np.ndarray:
    """Log-softmax of the logits at every prompt position, from the backend's context."""
    assert backend.loaded is not None
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(backend.loaded.ctx), True)
    logits = backend._decode([(tok, pos, 0, True) for pos, tok in enumerate(ids)])
    return log_softmax(logits)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def decode_speed(backend: LlamaBackend, ids: list[int]) -> float:
    """Tokens/s of one rollout batch (8 samples x 32 tokens, T=1)."""
    start = time.perf_counter()
    groups = backend.generate([tuple(ids)], 8, 32, 1.0, ())
    return sum(len(s.tokens) for g in groups for s in g) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dtypes", default="f32,q8_0", help="llama.cpp dtypes to time")
    parser.add_argument("--versions", type=int, default=3, help="timed versions (after one warm-up)")
    args = parser.parse_args()
    threads = default_threads()

    model, tok = load_model("smollm2")
    cfg = config_json(model)
    base_bytes = state_bytes(model)  # as the learner publishes the base
    pmodel = peft.get_peft_model(
        model, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0)
    ).eval()
    versions = [adapter_file(random_adapter(pmodel, seed)) for seed in range(1 + args.versions)]
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    out: dict = {
        "model": "SmolLM2-135M-Instruct",
        "rank": RANK,
        "alpha": ALPHA,
        "targets": TARGETS,
        "threads": threads,
        "torch_threads": torch.get_num_threads(),
        "prompt_tokens": len(ids),
        "versions_timed": args.versions,
        "adapter_parameters": sum(v.size for v in load(versions[0]).values()),
        "merged_safetensors_bytes": len(base_bytes),
        "per_version_s": {},
        "base_export_load_s": {},
        "switch_max_abs_dlogprob": {},
        "decode_tok_s": {},
    }

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_lora_gguf(cfg, load(versions[0]), ALPHA, work / "size.gguf")
        out["adapter_gguf_bytes"] = (work / "size.gguf").stat().st_size
        (work / "size.gguf").unlink()

        for dtype in args.dtypes.split(","):
            merge = LlamaBackend(dtype, threads, work / f"merge-{dtype}")
            node = LlamaBackend(dtype, threads, work / f"adapter-{dtype}")
            merge_s, prepare_s, adapter_s, diffs = [], [], [], []
            for v, adapter in enumerate(versions):
                t0 = time.perf_counter()
                weights = merge_lora(base_bytes, adapter)
                t1 = time.perf_counter()
                merge.load(cfg, weights)
                t2 = time.perf_counter()
                del weights
                node.use(node.prepare_lora(cfg, b"base", lambda: base_bytes, adapter))
                b = time.perf_counter() - t2
                if v == 0:  # the base is exported and loaded with the first version
                    out["base_export_load_s"][dtype] = round(b, 3)
                diffs.append(float(np.abs(prompt_logprobs(merge, ids) - prompt_logprobs(node, ids)).max()))
                if v > 0:  # version 0 warms up
                    merge_s.append(t1 - t0)
                    prepare_s.append(t2 - t1)
                    adapter_s.append(b)
            total = [m + p for m, p in zip(merge_s, prepare_s)]
            out["per_version_s"][dtype] = {
                "merge_export_load": round(statistics.median(total), 3),
                "adapter_load": round(statistics.median(adapter_s), 3),
                "merge_over_adapter": round(statistics.median(total) / statistics.median(adapter_s), 1),
                "merge_torch_and_safetensors": round(statistics.median(merge_s), 3),
                "merge_gguf_export_and_load": round(statistics.median(prepare_s), 3),
                "all_merge": [round(x, 3) for x in total],
                "all_adapter": [round(x, 3) for x in adapter_s],
            }
            out["switch_max_abs_dlogprob"][dtype] = round(max(diffs), 6)
            out["decode_tok_s"][dtype] = {
                "merged": round(decode_speed(merge, ids), 1),
                "adapter": round(decode_speed(node, ids), 1),
            }
            merge.close()
            node.close()

        out["correctness_f32"] = correctness(cfg, base_bytes, versions[0], pmodel, ids, work, threads)
    print(json.dumps(out, indent=None if args.json else 2))


def correctness(cfg: str, base: bytes, adapter: bytes, pmodel, ids: list[int], work: Path, threads: int) -> dict:
    """Max |d log-prob| on the prompt: merged GGUF vs base GGUF + adapter vs HF + PEFT (f32)."""
    merged_path, base_path, lora_path = work / "merged.gguf", work / "base.gguf", work / "lora.gguf"
    write_gguf(cfg, load(merge_lora(base, adapter)), merged_path, "f32")
    write_gguf(cfg, load(base), base_path, "f32")
    write_lora_gguf(cfg, load(adapter), ALPHA, lora_path)

    def run(**kw) -> np.ndarray:
        llm = llama_cpp.Llama(
            n_ctx=64,
            n_threads=threads,
            logits_all=True,
            type_k=GGML_TYPE_F32,
            type_v=GGML_TYPE_F32,
            flash_attn=False,
            verbose=False,
            **kw,
        )
        llm.eval(ids)
        lp = log_softmax(np.array(llm.scores[: len(ids)]))
        llm.close()
        return lp

    merged = run(model_path=str(merged_path))
    with_lora = run(model_path=str(base_path), lora_path=str(lora_path))
    plain = run(model_path=str(base_path))
    peft.set_peft_model_state_dict(pmodel, {k: torch.from_numpy(v) for k, v in load(adapter).items()})
    with torch.no_grad():
        hf = log_softmax(pmodel(torch.tensor([ids])).logits[0].numpy())
    return {
        "merged_vs_adapter": float(np.abs(merged - with_lora).max()),
        "merged_vs_hf_peft": float(np.abs(merged - hf).max()),
        "adapter_vs_hf_peft": float(np.abs(with_lora - hf).max()),
        "adapter_effect_base_vs_hf_peft": float(np.abs(plain - hf).max()),  # > 0: the adapter matters
    }


if __name__ == "__main__":
    main()
