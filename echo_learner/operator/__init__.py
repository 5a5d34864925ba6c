"""What the operator and the public read.

``api`` serves the status API, ``/metrics`` and the status page (``static/``);
``api_client`` reads it, for ``status_view`` (the terminal's view),
``invite`` and the CLI; ``leaderboard`` ranks contributors from the ledger.

May import every room below it (``tasks``, ``training``, ``verify``,
``swarm``) and the shared modules; only the assembly (``service``, ``cli``)
imports it.
"""
