"""LoopLag: a running mean of how late the event loop wakes a sleeper."""

import pytest
import trio
import trio.testing

from echo_learner.swarm.loop_lag import LoopLag


async def _period(clock: trio.testing.MockClock, seconds: float) -> None:
    """Let ``seconds`` pass on the mock clock while the loop is parked in its sleep."""
    await trio.testing.wait_all_tasks_blocked()
    clock.jump(seconds)
    await trio.testing.wait_all_tasks_blocked()  # it woke, measured, and sleeps again


async def test_a_late_wake_moves_the_mean_by_its_weight_and_on_time_wakes_let_it_decay(mock_clock):
    lag = LoopLag(period_s=0.05, weight=0.2)
    async with trio.open_nursery() as nursery:
        await nursery.start(lag.run)
        await _period(mock_clock, 0.05)  # on time
        assert lag.lag_s == 0.0
        await _period(mock_clock, 0.35)  # a 0.3 s hiccup: woken 0.3 s late
        assert lag.lag_s == pytest.approx(0.2 * 0.3)
        for _ in range(10):  # on time again: the hiccup fades by 1 - weight a period
            await _period(mock_clock, 0.05)
        assert lag.lag_s == pytest.approx(0.2 * 0.3 * 0.8**10)
        nursery.cancel_scope.cancel()


async def test_a_loop_kept_busy_reads_its_lateness():
    """Real time: a task that blocks the loop 40 ms in every 50 ms."""
    lag = LoopLag(period_s=0.01, weight=0.2)
    async with trio.open_nursery() as nursery:
        await nursery.start(lag.run)
        with trio.move_on_after(1.0):
            while True:
                busy_until = trio.current_time() + 0.04
                while trio.current_time() < busy_until:
                    pass  # the loop cannot run anything else meanwhile
                await trio.sleep(0.01)
        assert lag.lag_s > 0.01
        nursery.cancel_scope.cancel()
