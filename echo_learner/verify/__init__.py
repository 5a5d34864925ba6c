"""Judging a rollout batch before it is credited or trained on.

``verifier`` runs the checks (signer, assignment, window, replay, shapes) and
queues the log-prob recompute (``recompute``, emulating a node's precision
in ``emulate``); ``evidence`` and ``selection`` build the statistical case
against a node that lies about its precision or sampler; ``tolerance`` holds
the bounds per backend, dtype and device; ``cpu_split`` meters the learner's
CPU per batch by phase.

May import the shared modules and ``echo_learner.training`` (the log-prob
pass). The prompt pool and the capacity meter it reads are described here as
protocols, so that ``swarm``, which builds on verdicts, is not imported.
"""
