"""The learner: trains the policy on verified rollouts and publishes new versions.

The modules directly here are what every room shares, and the two that
assemble them:

- shared: the learner's typed configuration (``config``), the ledger of
  accepted work and receipts (``ledger``), the Prometheus metrics
  (``metrics``). They import nothing else of ``echo_learner``.
- assembly: ``service`` builds the learner from the rooms below and runs it;
  ``cli`` (and ``__main__``) is the operator's command line over it. They may
  import anything here; nothing here imports them.

The folders, by concern, lowest first:

- ``tasks``: what the policy is trained on (prompts and rewards), one module
  per task family.
- ``training``: the policy itself: the model and its device, LoRA, the GRPO
  objective, the trainer and its ranks, checkpoints, export, held-out
  evaluation.
- ``verify``: judging a rollout batch: the checks, the log-prob recompute,
  the evidence against a precision or sampler lie and its tolerances.
- ``swarm``: serving the nodes: work requests and admission, the prompt
  pool, rollout intake, peers and their standing, capacity and pacing, the
  job's directory record, publishing versions, receipts.
- ``operator``: what the operator and the public read: the HTTP status API
  and page, its client, invites, the leaderboard.

Each folder's ``__init__`` says what it may import; ``tests/test_layout.py``
enforces it.
"""
