"""llama.cpp's share of the GPU checks, in a process that never imports torch.

torch's CUDA and llama.cpp's in one process crashed llama.cpp's model load on
an H200 (issue 71), and a node keeps them apart (a llama.cpp node never
imports torch). The checks do the same: whoever needs llama.cpp on a GPU
(bench/gpu.py, tests/test_gpu.py) writes a job here and reads the answer.

    python bench/llama_child.py JOB.json ANSWER.json

A job is ``{"kind": "rollouts" | "speed", ...}`` (``rollouts``, ``speed``
below); the answer says ``torch_imported`` too, which must stay false.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_steps import LONG_CONTEXT, bare_tokens_per_s, continuous_over_chunked, node_tokens_per_s  # noqa: E402

from echo_node.backend_llama import LlamaBackend  # noqa: E402
from echo_node.backend_trial import random_llama  # noqa: E402
from echo_node.device import Device, cpu  # noqa: E402
from echo_node.llama_devices import gpu  # noqa: E402
from echo_node.memory import fit_backend, free_bytes  # noqa: E402
from echo_node.model_shape import model_shape  # noqa: E402
from protocol.models.gguf_export import f32_tensors, write_gguf  # noqa: E402


def device_of(kind: str) -> Device:
    return cpu() if kind == "cpu" else gpu(kind)


def rollouts(job: dict, work_dir: Path) -> dict:
    """Each version's calls: ``{"versions": [{"config", "weights" (a file),
    "calls": [{"prompts", "group", "new_tokens", "temperature", "stop"}]}],
    "dtype", "device"}`` -> every call's groups of (tokens, logprobs)."""
    backend = LlamaBackend(job["dtype"], threads=1, work_dir=work_dir, device=device_of(job["device"]))
    answers = []
    for version in job["versions"]:
        backend.load(version["config"], Path(version["weights"]).read_bytes())
        calls = []
        for call in version["calls"]:
            groups = backend.generate(
                [tuple(p) for p in call["prompts"]],
                call["group"],
                call["new_tokens"],
                call["temperature"],
                tuple(call["stop"]),
            )
            calls.append([[[list(s.tokens), list(s.logprobs)] for s in g] for g in groups])
        answers.append(calls)
    backend.close()
    return {"device": backend.device.name, "versions": answers}


def speed(job: dict, work_dir: Path) -> dict:
    """Tokens/s of the node's ``generate`` and of a bare llama.cpp loop (its
    own sampler chains, a context holding every row: bench/decode_steps.py)
    at each row count, the node's host ms per step at 64 rows; on the CPU
    with ``cpu_threads`` at ``cpu_rows``; continuous over chunked batching.
    ``{"config", "dtype", "device", "rows", "group", "prompt_tokens",
    "new_tokens", "threads", "cpu_threads", "cpu_rows", "cpu_new_tokens"}``."""
    config = job["config"]
    config_json, weights = random_llama(config, seed=0)
    rng = random.Random(0)
    vocab = config["vocab_size"]
    new, length = job["new_tokens"], job["prompt_tokens"]
    device = device_of(job["device"])

    work_dir.mkdir(parents=True, exist_ok=True)
    master = work_dir / f"model-{job['dtype']}.gguf"
    write_gguf(config_json, f32_tensors(weights), master, job["dtype"])  # once: each backend loads a copy
    copies = itertools.count()

    def backend(cells: int = 0, sequences: int = 0, on: Device = device, threads: int = 0) -> LlamaBackend:
        """The model on ``on``: sized as a node sizes itself, or with ``cells`` for ``sequences``."""
        made = LlamaBackend(job["dtype"], threads=threads or job["threads"], work_dir=work_dir, device=on)
        if cells:
            made.kv_cells, made.max_sequences = cells, sequences
        else:
            fit_backend(made, model_shape(config_json), free_bytes(on, 0))
        copy = work_dir / f"copy-{next(copies)}.gguf"
        shutil.copyfile(master, copy)  # the model deletes its file when it is freed
        made.use(made.new_context(made.load_file(copy)))
        return made

    def prompts(rows: int) -> tuple[list[tuple[int, ...]], int]:
        """``rows`` rows: prompts of ``prompt_tokens``, and their group size."""
        group = min(job["group"], rows)
        return [tuple(rng.randrange(300, vocab) for _ in range(length)) for _ in range(rows // group)], group

    out: dict = {"device": device.name, "rows": {}}
    node = backend()
    out["node_context"] = {"cells": node.kv_cells, "sequences": node.max_sequences}
    for rows in job["rows"]:
        batch, group = prompts(rows)
        bare = backend(rows * (length + new) + 256, rows)
        node.generate(batch, group, 4, 1.0, ())  # warmed up
        bare_tokens_per_s(bare, batch, group, 4)
        # Alternated, the best of each: run-to-run noise is +-10 % here.
        nodes, bares = [], []
        for _ in range(job["repeats"]):
            nodes.append(node_tokens_per_s(node, batch, group, new))
            bares.append(bare_tokens_per_s(bare, batch, group, new))
        best, host_ms = max(nodes)
        out["rows"][str(rows)] = {
            "node": round(best, 1),
            "bare": round(max(bares), 1),
            "node_over_bare": round(best / max(bares), 3),
            "host_ms_per_step": round(host_ms, 3),
        }
        bare.close()
    node.close()
    on_cpu = backend(on=cpu(), threads=job["cpu_threads"])
    batch, group = prompts(job["cpu_rows"])
    node_tokens_per_s(on_cpu, batch, group, 4)  # warmed up
    rate = max(node_tokens_per_s(on_cpu, batch, group, job["cpu_new_tokens"])[0] for _ in range(job["repeats"]))
    on_cpu.close()
    out["cpu"] = {"threads": job["cpu_threads"], "rows": job["cpu_rows"], "tokens_per_s": round(rate, 1)}
    wide = backend(LONG_CONTEXT, 64)
    out["continuous"] = continuous_over_chunked(wide, vocab, rng)
    wide.close()
    return out


def main(job_path: str, answer_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    work_dir = Path(answer_path).parent / "llama-work"
    answer = {"rollouts": rollouts, "speed": speed}[job["kind"]](job, work_dir)
    answer["torch_imported"] = "torch" in sys.modules
    Path(answer_path).write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
