"""Choosing the inference backend for this machine (``--backend``, ``--dtype``, ``--device``).

Each backend's module says what it is (its ``SPEC``, ``echo_node.backend.BackendSpec``);
``specs()`` lists them, most preferred first: ``--backend auto`` takes the first
one installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from echo_node.backend import Backend, BackendSpec
from echo_node.device import Device, DeviceUnavailable, cpu, default_threads


def specs() -> Iterator[BackendSpec]:
    """Every backend's spec, most preferred first, each module imported only
    when reached: choosing llama.cpp does not import torch and transformers
    (4 s of a node's start on 2 cores)."""
    from echo_node.backend_llama import SPEC as LLAMA

    yield LLAMA
    from echo_node.backend_torch import SPEC as TORCH

    yield TORCH


class BackendUnavailable(RuntimeError):
    """The asked-for backend cannot run here; the message says what to do."""


def spec_of(name: str) -> BackendSpec:
    for spec in specs():
        if spec.name == name:
            return spec
    raise BackendUnavailable(f"no backend {name!r}: the node knows {', '.join(s.name for s in specs())}")


def llama_installed() -> bool:
    return spec_of("llama").installed()


def choose(name: str, dtype: str, threads: int, work_dir: Path, device: str = "auto") -> tuple[Backend, str]:
    """The backend to run and why it was chosen (``name``: auto or a
    backend's; ``dtype`` auto lets the backend pick from the job's model and
    free memory, or from the device; ``threads`` 0: physical cores minus one)."""
    if name == "auto":
        skipped = []
        for spec in specs():
            if spec.installed():
                break
            skipped.append(f"; {spec.install}")
        why = f"auto: {spec.title} is installed{''.join(skipped)}"
    else:
        spec, why = spec_of(name), "asked for with --backend"
    if not spec.installed():
        raise BackendUnavailable(spec.install)
    if dtype != "auto" and dtype not in spec.dtypes:
        others = [s.name for s in specs() if dtype in s.dtypes]
        instead = f" (use --backend {others[0]})" if others else ""
        runs = f"{', '.join(spec.dtypes[:-1])} or {spec.dtypes[-1]}"
        raise BackendUnavailable(f"the {spec.title} backend runs {runs}, not {dtype}{instead}")
    try:
        where, why_device = choose_device(device, spec)
    except DeviceUnavailable as exc:
        raise BackendUnavailable(str(exc)) from None
    threads = threads or default_threads()
    why = f"{why}; on {where.name} ({why_device}); CPU threads: {threads}"
    return spec.make(dtype, threads, work_dir, where), why


def choose_device(asked: str, backend: BackendSpec) -> tuple[Device, str]:
    """The device ``backend`` runs on for ``--device asked``, and why.
    Raises ``DeviceUnavailable``."""
    usable = backend.gpu_kinds()
    if asked == "auto":
        if usable:
            return backend.gpu(usable[0]), f"auto: {backend.name} can use the {usable[0]} GPU"
        return cpu(), f"auto: no GPU {backend.name} can use here"
    if asked == "cpu":
        return cpu(), "asked for with --device"
    if asked in usable:
        return backend.gpu(asked), "asked for with --device"
    raise DeviceUnavailable(f"--device {asked}: {backend.no_gpu(asked)}")
