import random

from echo_learner.tasks import ReverseTask, TaskPrompt


def test_reverse_prompts_and_rewards():
    task = ReverseTask()
    p = task.sample(random.Random(1))
    assert p.text.endswith("=") and p.answer == p.text[:-1][::-1]
    q = TaskPrompt("abc=", "cba")
    assert task.reward(q, "cba") == 1.0
    assert task.reward(q, "cbd") == 2 / 3
    assert task.reward(q, "cbaaaa") == 0.5  # rambling is penalised
    assert task.reward(q, "") == 0.0
