"""Tasks: the prompts the learner hands out and the rewards it computes itself.

A node never reports a reward: it could lie. The learner keeps each prompt's
expected answer and scores completions on arrival.

``base`` defines what a task is (``Task``, ``TaskPrompt``); ``registry``
turns a ``--task`` spec into one: the built-in families ``reverse`` (the toy
task of the built-in model), ``rg:<dataset>`` (any procedural task of
reasoning-gym) and ``math:<dataset>`` (reasoning-gym's math problems scored
with math-verify), and any family a package registers under the
``echo_swarm.tasks`` entry point group (docs/tasks.md).
"""
