"""Serving the nodes of the job's swarm.

Work: ``work_handler`` answers work requests; ``admission`` decides who
gets prompts now, ``sizing`` how many, ``fairness`` how they are shared,
``pool`` (with ``live_prompts`` and ``changes``) holds the prompts handed
out. Rollouts: ``rollout_handler`` judges each batch, writes its verdict and
answers with the receipt. Standing: ``peers`` keeps each node's record, ``capacity`` and
``pacing`` forecast what the swarm can supply, ``loop_lag`` measures the
learner's event loop. The job's face on the network: ``directory`` (its DHT
record), ``bootstrap_probe``, ``job_bounds``, ``publishing`` (new versions),
``receipt_pages``.

May import the shared modules, ``tasks``, ``training`` and ``verify``; not
``operator``.
"""
