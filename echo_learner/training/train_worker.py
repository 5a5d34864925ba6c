"""One rank of ``echo-learner run --train-procs N``, started by ``torchrun``.

Every rank holds a shard of the policy (torch's FSDP, ``fully_shard``: gloo
on the CPU, NCCL on GPUs) and of its AdamW state. Rank 0 also talks to the
learner's service process over a local socket (``echo_learner.training.train_group``)
and passes each request on to the other ranks; all ranks then run it
together:

- ``load``: take the service's full weights (and optimiser state, resuming);
- ``step``: one GRPO step. Every rank gets the whole batch and trains on its
  rows (every N-th completion) with the loss weighted by the rows' share of
  the batch's tokens, so the summed gradient is the one-process gradient;
- ``weights`` / ``optimizer``: gather the full state to rank 0 for publishing
  and checkpoints;
- ``stop``.

Requests and answers are msgpack; tensors travel as safetensors, the
optimiser state as a ``torch.save`` file loaded with ``weights_only=True``.
Nothing here listens on the network: the socket is a Unix socket in a
private directory, and the service proves itself with a random key.
"""

from __future__ import annotations

import copy
import io
import json
import os
import sys
import traceback
import warnings
from typing import Any

import msgpack
import torch
import torch.distributed as dist
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from echo_learner.training.trainer import Batch, Objective, Passes, ScoredGroup, Trainer, reward_mean

AUTHKEY_ENV = "ECHO_TRAIN_AUTHKEY"


def main() -> None:
    address, settings = sys.argv[1], json.loads(sys.argv[2])
    # transformers' deprecation notices, raised inside PEFT and FSDP, once per rank.
    warnings.simplefilter("ignore", FutureWarning)
    cuda = settings["device"] == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    # Requests fan out from rank 0 on gloo whatever trains: they are bytes on the CPU.
    control = dist.new_group(backend="gloo")
    torch.set_num_threads(settings["threads"])
    key = bytes.fromhex(os.environ.pop(AUTHKEY_ENV))
    worker = Worker(settings, device)
    link = _connect(address, key) if rank == 0 else None
    try:
        while True:
            request = _fan_out(link, control)
            try:
                answer = worker.handle(request)
            except Exception:
                # A request's bad inputs fail every rank alike, so the ranks
                # stay in step: report it and go on. (A rank that dies instead
                # ends them all: torchrun stops the others.)
                answer = {"error": traceback.format_exc(limit=8)}
            if link is not None:
                link.send_bytes(msgpack.packb(answer))
            if request["op"] == "stop":
                break
    finally:
        if link is not None:
            link.close()
        dist.destroy_process_group()


def _connect(address: str, key: bytes) -> Any:
    from multiprocessing.connection import Client

    link = Client(address, family="AF_UNIX")
    link.send_bytes(key)  # the service checks it before anything else
    return link


def _fan_out(link: Any, group: dist.ProcessGroup) -> dict:
    """Rank 0 reads the next request from the service; every rank gets it."""
    data = link.recv_bytes() if link is not None else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(size, 0, group=group)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(int(size), dtype=torch.uint8)
    dist.broadcast(buf, 0, group=group)
    return msgpack.unpackb(buf.numpy().tobytes(), strict_map_key=False)


class Worker:
    """The sharded policy and optimiser of one rank."""

    def __init__(self, settings: dict, device: torch.device):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from echo_learner.training.lora import LoraSettings, wrap
        from echo_learner.training.model import load_model

        model, _ = load_model(settings["model"], settings["seed"])
        if settings["lora"]:
            model = wrap(model, LoraSettings.from_dict(settings["lora"]))
        model = model.to(device)
        world = dist.get_world_size()
        mesh = init_device_mesh(device.type, (world,))
        # The KL reference is the starting model, as in one process; frozen and sharded too.
        reference = None
        if settings["objective"]["kl_coef"] > 0:
            reference = copy.deepcopy(model).eval().requires_grad_(False)
        for m in (model, reference):
            if m is None:
                continue
            for layer in _decoder_layers(m):
                fully_shard(layer, mesh=mesh)
            fully_shard(m, mesh=mesh)
        self.trainer = Trainer(
            model,
            lr=settings["lr"],
            objective=Objective(**settings["objective"]),
            pad_id=settings["pad_id"],
            temperature=settings["temperature"],
            reference=reference,
            # Every rank makes the same passes, whatever its rows.
            passes=Passes(max_logit_bytes=settings["max_logit_bytes"], pack=False),
        )
        self.rank, self.world = dist.get_rank(), world

    def handle(self, request: dict) -> dict:
        op = request["op"]
        if op == "step":
            return self.step([_group(*g) for g in request["groups"]])
        if op == "load":
            self.load(request["model"], request.get("optimizer"))
            return {}
        if op == "weights":
            return {"model": self.weights()}
        if op == "optimizer":
            return {"optimizer": self.optimizer_state()}
        if op == "stop":
            return {}
        raise ValueError(f"unknown request {op!r}")

    def step(self, groups: list[ScoredGroup]) -> dict:
        trainer = self.trainer
        batch = Batch.of(groups, trainer.objective)
        if batch is None:  # no signal: every rank skips alike (Trainer.step says why)
            return {"loss": 0.0, "kl": 0.0, "reward_mean": reward_mean(groups), "tokens": 0}
        rows = range(self.rank, len(batch.completions), self.world)
        # Each backward pass reduces gradients across ranks: all must make as many.
        passes = torch.tensor([trainer.passes(batch, rows)])
        dist.all_reduce(passes, op=dist.ReduceOp.MAX)
        trainer.model.train()
        trainer.optimizer.zero_grad(set_to_none=True)
        # FSDP averages gradients over ranks; each rank's share is of the whole
        # batch, so scale by the world size to get their sum.
        loss, kl = trainer.backward(batch, rows, passes=int(passes), scale=float(self.world))
        torch.nn.utils.clip_grad_norm_([p for p in trainer.model.parameters() if p.requires_grad], 1.0)
        trainer.optimizer.step()
        totals = torch.tensor([loss, kl], dtype=torch.float64)
        dist.all_reduce(totals)
        return {
            "loss": float(totals[0]),
            "kl": float(totals[1]),
            "reward_mean": batch.reward_mean,
            "tokens": batch.tokens,
        }

    def _options(self, **kw: Any) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **kw)

    def weights(self) -> bytes | None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(self.trainer.model, options=self._options(cpu_offload=True))
        return save_tensors({k: v.contiguous() for k, v in state.items()}) if self.rank == 0 else None

    def optimizer_state(self) -> bytes | None:
        """Rank 0: the full optimiser state in ``Optimizer.state_dict``'s own
        form (parameters numbered in order), as one process would checkpoint it."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state = get_optimizer_state_dict(
            self.trainer.model, self.trainer.optimizer, options=self._options(cpu_offload=True)
        )
        if self.rank != 0:
            return None
        names = [n for g in state["param_groups"] for n in g["params"]]
        number = {name: i for i, name in enumerate(names)}
        numbered = {
            "state": {number[n]: _own(s) for n, s in state["state"].items()},
            "param_groups": [{**g, "params": [number[n] for n in g["params"]]} for g in state["param_groups"]],
        }
        out = io.BytesIO()
        torch.save(numbered, out)
        return out.getvalue()

    def load(self, weights: bytes, optimizer: bytes | None) -> None:
        """Rank 0's copy of the full state is spread to every rank's shards."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        model = self.trainer.model
        options = self._options(broadcast_from_rank0=True, strict=False)  # a tied weight comes once
        set_model_state_dict(model, load_tensors(weights) if self.rank == 0 else {}, options=options)
        if optimizer is None:
            return
        named: dict = {}
        if self.rank == 0:
            numbered = torch.load(io.BytesIO(optimizer), weights_only=True)
            names = [n for n, p in model.named_parameters() if p.requires_grad]
            named = {
                "state": {names[i]: _own(s) for i, s in numbered["state"].items()},
                "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in numbered["param_groups"]],
            }
        set_optimizer_state_dict(model, self.trainer.optimizer, named, options=self._options(broadcast_from_rank0=True))


def _own(state: dict) -> dict:
    """One parameter's optimiser state with tensors of its own: gathered
    states can share one ``step`` tensor, which AdamW then counts up once
    per parameter, every step."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def _group(prompt: list, completions: list, behaviour: list, rewards: list) -> ScoredGroup:
    """A ScoredGroup from its msgpack form (lists for tuples)."""
    return ScoredGroup(tuple(prompt), tuple(map(tuple, completions)), tuple(map(tuple, behaviour)), tuple(rewards))


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks: each becomes an FSDP unit of its own (gathered
    for its forward and freed after), the rest (embeddings, head) the root's."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


if __name__ == "__main__":
    main()
