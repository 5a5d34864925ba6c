"""Tables for the command line (rich): ``echo-learner peers``, ``ledger`` and
``status``, ``echo-node credits``.

In a terminal, a table with a header rule, numbers right-aligned; piped or
redirected, the same columns as plain aligned text (no colours, no box
characters), so that ``grep`` and ``awk`` read it. ``--json`` bypasses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

_UNLIMITED = 10_000  # columns: wider than any row we print


def print_table(columns: Sequence[str], rows: Iterable[Sequence[object]], *, numeric: Sequence[str] = ()) -> None:
    """Print ``rows`` under ``columns``; the ``numeric`` columns right-aligned."""
    # Piped, lines are as long as the data: rich caps a print's width at the
    # console's, which is an 80-column guess when there is no terminal.
    terminal = Console().is_terminal
    console = Console() if terminal else Console(width=_UNLIMITED)
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
    console.print(table, crop=False, soft_wrap=not terminal)


def print_fields(fields: Iterable[tuple[str, object]]) -> None:
    """Print ``(label, value)`` pairs as two columns without a header
    (``status``, ``credits``): in a terminal a rich table whose long values
    wrap within their column; piped, one plain line per field."""
    fields = [(label, str(value)) for label, value in fields]
    console = Console()
    if not console.is_terminal:
        width = max((len(label) for label, _ in fields), default=0)
        for label, value in fields:
            print(f"{label:<{width}}  {value}".rstrip(), flush=True)
        return
    table = Table(box=None, show_header=False, pad_edge=False, show_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in fields:
        table.add_row(label, value)
    console.print(table)
