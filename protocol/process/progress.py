"""Progress bars for long work (rich): weight downloads, training steps, evaluation.

Shown on stderr when it is a terminal, and not at all otherwise (piped,
under a service manager, in tests), where the logs and ``--json`` say what
happened.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


@contextlib.contextmanager
def progress(
    description: str, total: float, *, completed: float = 0, in_bytes: bool = False, transient: bool = False
) -> Iterator[Callable[..., None]]:
    """A bar for ``total`` units (bytes, with rate and time left, when
    ``in_bytes``); yields ``update(completed, **fields)``, the fields shown
    after the bar (``reward=0.41``). ``transient``: gone when done."""
    console = Console(stderr=True)
    counts: list[ProgressColumn] = (
        [DownloadColumn(), TransferSpeedColumn()] if in_bytes else [MofNCompleteColumn(), TimeElapsedColumn()]
    )
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        *counts,
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    ]
    with Progress(*columns, console=console, transient=transient, disable=not console.is_terminal) as bar:
        task = bar.add_task(description, total=total, completed=completed, info="")

        def update(done: float, **fields: object) -> None:
            bar.update(task, completed=done, info=" ".join(f"{k}={v}" for k, v in fields.items()))

        yield update
