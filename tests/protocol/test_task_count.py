"""``task_count``: the trio tasks alive, so that a leak shows as growth."""

import trio
import trio.testing

from protocol.process.runtime import task_count


async def test_task_count_follows_tasks_as_they_start_and_end():
    before = task_count()
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        assert task_count() == before + 5
        nursery.cancel_scope.cancel()
    assert task_count() == before
