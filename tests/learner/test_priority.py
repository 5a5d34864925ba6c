"""Model work runs below the event loop's CPU priority (echo_learner.training.priority)."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import trio

from echo_learner.training.priority import LOWEST, lowered, set_model_work_nice

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a per-thread nice value is Linux's")


def nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.fixture
def nice_by():  # type: ignore[no-untyped-def]
    yield set_model_work_nice
    set_model_work_nice(0)


def test_model_work_lowers_its_own_thread_once_and_leaves_the_loop_alone(nice_by) -> None:  # type: ignore[no-untyped-def]
    nice_by(5)
    loop_nice = nice_of_this_thread()

    async def main() -> tuple[int, int]:
        def twice() -> tuple[int, int]:  # a cached worker runs model work again and again: lowered once
            return lowered(nice_of_this_thread), lowered(nice_of_this_thread)

        return await trio.to_thread.run_sync(twice)

    first, again = trio.run(main)
    assert first == min(loop_nice + 5, LOWEST)
    assert again == first
    assert nice_of_this_thread() == loop_nice  # the loop's thread keeps its priority


def test_nice_zero_changes_nothing(nice_by) -> None:  # type: ignore[no-untyped-def]
    nice_by(0)
    before = nice_of_this_thread()
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(lowered(nice_of_this_thread)))
    thread.start()
    thread.join()
    assert seen == [before]
