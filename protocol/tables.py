"""Tables for the command line (rich): ``echo-learner peers`` and ``ledger``.

In a terminal, a table with a header rule, numbers right-aligned; piped or
redirected, the same columns as plain aligned text (no colours, no box
characters), so that ``grep`` and ``awk`` read it. ``--json`` bypasses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table


def print_table(columns: Sequence[str], rows: Iterable[Sequence[object]], *, numeric: Sequence[str] = ()) -> None:
    """Print ``rows`` under ``columns``; the ``numeric`` columns right-aligned."""
    console = Console()
    terminal = console.is_terminal
    table = Table(
        box=box.SIMPLE_HEAD if terminal else None,
        header_style="bold" if terminal else "",
        pad_edge=False,
        show_edge=False,
    )
    for name in columns:
        table.add_column(name, justify="right" if name in numeric else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    # Piped, lines are as long as the data (no wrapping at an 80-column guess).
    console.print(table, width=None if terminal else 10_000, crop=False, soft_wrap=not terminal)
