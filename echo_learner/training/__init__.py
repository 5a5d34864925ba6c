"""The policy and how it learns.

``model`` loads it (``device`` places it), ``lora`` adapts it, ``grpo`` is the
objective, ``logprobs`` the teacher-forced pass that training and the
verifier's recompute share, ``trainer`` one optimiser step over scored
groups (``train_group`` and ``train_worker`` spread it over ranks),
``checkpoint`` and ``export`` write it down, ``evaluate`` and ``heldout``
score it on held-out prompts; ``priority`` runs model work below the event
loop's CPU priority.

May import the shared modules (``echo_learner.config``, ``ledger``,
``metrics``) and ``echo_learner.tasks``; nothing that serves the swarm.
"""
