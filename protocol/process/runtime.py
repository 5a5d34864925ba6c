"""Running a daemon under trio until it finishes or the user presses Ctrl-C."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable

import trio


def run_until_signal(main: Callable[[], Awaitable[object]]) -> bool:
    """Run ``main``; SIGINT or SIGTERM cancels it cleanly (its nurseries unwind).

    Returns True if a signal stopped it, False if ``main`` returned by itself.
    """
    stopped_by_signal = False

    async def supervisor() -> None:
        nonlocal stopped_by_signal
        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                nonlocal stopped_by_signal
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        stopped_by_signal = True
                        nursery.cancel_scope.cancel()
                        return

            nursery.start_soon(watch_signals)
            await main()
            nursery.cancel_scope.cancel()

    try:
        trio.run(supervisor)
    except BaseExceptionGroup as group:
        # Nurseries wrap errors in groups; a lone error (the usual case: a bad
        # address, an unreachable bootstrap peer) is re-raised bare so the CLI
        # can report it in one line.
        leaves = list(_leaves(group))
        if len(leaves) == 1:
            raise leaves[0] from None
        raise
    return stopped_by_signal


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def task_count() -> int:
    """Trio tasks alive in this run, the root included (a leak shows as growth)."""
    count, todo = 0, [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        count += 1
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)
    return count
