"""From a ``--task`` spec to a task.

A spec is ``<family>[:<argument>]``: ``reverse``, ``rg:basic_arithmetic``,
``math:basic_arithmetic:max_terms=3``, ``mytask:level=2``. The family names a
factory, ``factory(argument) -> Task``: ours below, or one a package
registers under the ``echo_swarm.tasks`` entry point group, e.g. in its
pyproject.toml::

    [project.entry-points."echo_swarm.tasks"]
    mytask = "mypackage.tasks:make"

Factories are imported only when their family is asked for, so a broken
plugin cannot stop another task from loading.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from echo_learner.tasks.base import Task, TaskError
from protocol.messages import MAX_TASK

ENTRY_POINT_GROUP = "echo_swarm.tasks"
BUILT_IN = {
    "reverse": "echo_learner.tasks.reverse:make",
    "rg": "echo_learner.tasks.rg:make",
    "math": "echo_learner.tasks.maths:make",
}


def families() -> dict[str, str]:
    """Every task family: name -> ``module:factory`` (plugins cannot take a
    built-in name)."""
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return {**found, **BUILT_IN}


def _factory(target: str) -> Callable[[str], Task]:
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as exc:  # a plugin that does not import is the plugin's bug, said in one line
        raise TaskError(f"task factory {target} could not be loaded: {type(exc).__name__}: {exc}") from None


def load_task(spec: str) -> Task:
    """The task ``spec`` names; ``TaskError`` with what is wrong otherwise."""
    if len(spec) > MAX_TASK:  # it travels in every manifest
        raise TaskError(f"task spec of {len(spec)} characters; at most {MAX_TASK}")
    family, _, argument = spec.strip().partition(":")
    known = families()
    if family not in known:
        raise TaskError(f"no task family {family!r} (known: {', '.join(sorted(known))})")
    task = _factory(known[family])(argument)
    if not isinstance(task, Task):
        raise TaskError(f"{known[family]} returned {type(task).__name__}, which is not a Task")
    return task
