"""``--train-procs N``: the training step on N ``torchrun`` ranks with FSDP.

``TrainGroup`` has the ``Trainer``'s interface, so the learner's service
process runs unchanged: it keeps the work and rollout handlers, verification, the ledger,
publishing and checkpoints, and its own copy of the policy (``model``) for
what those need (snapshots to verify against, weights to publish). Each
``step`` goes to the ranks (``echo_learner.training.train_worker``); the service's copy
is refreshed from them only when it is needed (``sync``, before a publish or
a checkpoint), not after every step.

Checkpoints are the same as one process writes (the full model and the
optimiser state numbered as ``Optimizer.state_dict`` numbers it), so a run
can resume with a different ``--train-procs``.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import msgpack
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from echo_learner.training.lora import frozen_copy
from echo_learner.training.train_worker import AUTHKEY_ENV
from echo_learner.training.trainer import ScoredGroup, StepStats
from protocol.process.logs import event

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0  # torch's import and the process group on a busy machine
STOP_TIMEOUT_S = 30.0


class TrainGroupError(RuntimeError):
    """The ranks could not start, or failed a request; the message says why."""


def full_state_bytes(model: torch.nn.Module) -> bytes:
    """Every tensor of ``model``'s state as safetensors, a tied weight once
    (safetensors refuses tensors that share memory; loading re-ties them)."""
    seen: set[int] = set()
    state = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        state[name] = tensor.detach().to("cpu").contiguous()
    return save_tensors(state)


def load_full_state(model: torch.nn.Module, data: bytes) -> None:
    """Load ``full_state_bytes``' output (or the ranks' gathered state) into
    ``model``; only tied tensors may be missing."""
    state = load_tensors(data)
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded = {t.data_ptr() for name, t in own.items() if name in state}
    untied = [name for name in missing if own[name].data_ptr() not in loaded]
    if unexpected or untied:
        raise TrainGroupError(f"the ranks' weights do not fit the model: missing {untied[:3]}, extra {unexpected[:3]}")


def check_train_procs(procs: int, device: torch.device) -> None:
    """Refuse a ``--train-procs`` this machine cannot run, in one line."""
    if device.type not in ("cpu", "cuda"):
        raise TrainGroupError(f"--train-procs {procs}: FSDP trains on the CPU or CUDA GPUs, not {device.type}")
    if device.type == "cuda" and procs > torch.cuda.device_count():
        raise TrainGroupError(f"--train-procs {procs}: one GPU per process, and torch sees {torch.cuda.device_count()}")


class TrainGroup:
    """The ``Trainer`` interface over ``procs`` torchrun ranks.

    Starting it launches ``python -m torch.distributed.run`` (its own process
    group: ``close`` ends it all) and waits for rank 0 to connect to a Unix
    socket in a private temporary directory and prove it knows a random key.
    Every method blocks (the learner calls them from a worker thread) and
    raises ``TrainGroupError`` when the ranks fail or exit.
    """

    def __init__(self, model: torch.nn.Module, *, procs: int, settings: dict, start_timeout_s: float = START_TIMEOUT_S):
        self.model = model
        self._lock = threading.Lock()
        self._stale = False  # the ranks trained since ``model`` was refreshed
        self._dir = tempfile.mkdtemp(prefix="echo-train-")  # 0700: only this user can connect
        address = os.path.join(self._dir, "rank0.sock")
        key = os.urandom(32)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen(1)
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={procs}",
            "-m",
            "echo_learner.training.train_worker",
            address,
            json.dumps(settings),
        ]
        # torchrun sets OMP_NUM_THREADS=1 (and says so) unless it is set.
        env = {**os.environ, AUTHKEY_ENV: key.hex(), "OMP_NUM_THREADS": str(settings["threads"])}
        self.process = subprocess.Popen(command, env=env, start_new_session=True)
        try:
            self._link = self._accept(server, key, start_timeout_s)
        except BaseException:
            self._kill()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        finally:
            server.close()
        event(log, logging.INFO, "training ranks started", procs=procs, pid=self.process.pid)
        try:
            self._call({"op": "load", "model": full_state_bytes(model)})
        except BaseException:
            self.close()
            raise

    def _accept(self, server: socket.socket, key: bytes, timeout_s: float) -> Connection:
        deadline = time.monotonic() + timeout_s
        server.settimeout(0.5)  # to notice a torchrun that exits instead of connecting
        while True:
            if self.process.poll() is not None:
                raise TrainGroupError(f"torchrun exited with {self.process.returncode} before rank 0 connected")
            if time.monotonic() > deadline:
                raise TrainGroupError(f"rank 0 did not connect within {timeout_s:.0f} s")
            try:
                sock, _ = server.accept()
            except TimeoutError:
                continue
            # Blocking: Connection writes to the raw descriptor. Only this
            # user can reach the socket's directory; the key proves it is our rank 0.
            sock.setblocking(True)
            link = Connection(sock.detach())
            try:
                offered = link.recv_bytes(64)
            except (OSError, EOFError):
                link.close()
                continue
            if hmac.compare_digest(offered, key):
                return link
            link.close()

    def _call(self, request: dict) -> dict:
        with self._lock:
            try:
                self._link.send_bytes(msgpack.packb(request))
                answer = msgpack.unpackb(self._link.recv_bytes(), strict_map_key=False)
            except (OSError, EOFError) as exc:
                code = self.process.poll()
                raise TrainGroupError(
                    f"the training ranks went away ({'exit code ' + str(code) if code is not None else exc})"
                ) from exc
        if "error" in answer:
            raise TrainGroupError(f"the training ranks failed {request['op']!r}:\n{answer['error']}")
        return answer

    # --- the Trainer interface ----------------------------------------------------

    def step(self, groups: list[ScoredGroup]) -> StepStats:
        wire = [[g.prompt_tokens, g.completions, g.behaviour_logprobs, g.rewards] for g in groups]
        answer = self._call({"op": "step", "groups": wire})
        self._stale = True
        return StepStats(
            loss=answer["loss"], kl=answer["kl"], reward_mean=answer["reward_mean"], tokens=answer["tokens"]
        )

    def sync(self) -> None:
        """Copy the ranks' newest weights into ``model`` (if they trained since)."""
        if self._stale:
            load_full_state(self.model, self._call({"op": "weights"})["model"])
            self._stale = False

    def snapshot(self) -> torch.nn.Module:
        self.sync()
        return frozen_copy(self.model)

    def optimizer_state(self) -> dict:
        data = self._call({"op": "optimizer"})["optimizer"]
        return torch.load(io.BytesIO(data), weights_only=True)

    def resume(self, optimizer_state: dict) -> None:
        """Continue from a checkpoint: the ranks take ``model`` (loaded from it
        in place) and the checkpoint's optimiser state."""
        out = io.BytesIO()
        torch.save(optimizer_state, out)
        self._call({"op": "load", "model": full_state_bytes(self.model), "optimizer": out.getvalue()})
        self._stale = False

    def close(self) -> None:
        """Stop the ranks (asked, then ended) and remove the socket's directory."""
        try:
            if self.process.poll() is None:
                try:
                    self._call({"op": "stop"})
                    self.process.wait(STOP_TIMEOUT_S)
                except (TrainGroupError, subprocess.TimeoutExpired):
                    pass
            self._kill()
            self._link.close()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def __enter__(self) -> TrainGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
