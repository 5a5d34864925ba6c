"""bench/convergence.py stops each mode at its plateau, not on a stall it leaves later."""

import convergence


def curve(*stretches: tuple[int, float]) -> list[dict]:
    """Step records whose reward holds each (steps, reward) in turn."""
    return [{"reward_mean": reward, "elapsed_s": 0.0} for steps, reward in stretches for _ in range(steps)]


def test_a_stall_shorter_than_the_climb_to_the_threshold_does_not_stop_the_run():
    # 155 steps to 0.5, then 220 held at 0.67: windows of 100 steps stopped such
    # a run (async, which went on to 0.98 in its next run).
    rising = curve((150, 0.1), (150, 0.5), (220, 0.67))
    assert convergence.steps_to_threshold(rising, 0.5) == 155
    assert not convergence.levelled_off(rising, 0.5)
    # Held for twice the climb: that is its plateau.
    assert convergence.levelled_off(rising + curve((100, 0.67)), 0.5)


def test_a_run_at_the_task_s_best_reward_has_levelled_off_at_once():
    solved = curve((150, 0.1), (150, 0.5), (90, 1.0))
    assert not convergence.levelled_off(solved, 0.5)  # the last 100 steps average 0.95
    assert convergence.levelled_off(solved + curve((10, 1.0)), 0.5)


def test_a_run_below_the_threshold_goes_on():
    assert not convergence.levelled_off(curve((1000, 0.4)), 0.5)
