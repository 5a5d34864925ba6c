"""``echo-learner invite``: one line that lets a volunteer join this job
(``echo-node join <invite>``), made from the learner's data dir and signed
with its identity (the format: ``protocol.invite``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

from echo_learner.config import LearnerConfig
from echo_learner.operator import api_client
from protocol.process.config import fail


def command(args: argparse.Namespace, prog: str) -> None:
    """Print the invite: the job, this learner's key, the bootstrap peers (the
    run's and ``--bootstrap``) and addresses (``--addr``, and those a running
    learner listens on)."""
    from protocol import invite as invites
    from protocol.identity import KeyFileError, load
    from protocol.net.host import BadMultiaddr, check_addrs

    settings_path = args.data_dir / "config.json"
    try:
        settings = json.loads(settings_path.read_text())
        identity = load(args.data_dir / "identity.key")
    except (OSError, ValueError) as exc:
        fail(prog, f"{args.data_dir} holds no learner ({exc}); run `echo-learner run` there first")
    except KeyFileError as exc:
        fail(prog, str(exc))
    try:
        check_addrs(args.addr, args.bootstrap, bind=False)  # --addr: where others reach the learner; no /p2p/ part
    except BadMultiaddr as exc:
        fail(prog, str(exc))
    known = {f.name for f in fields(LearnerConfig)}
    config = LearnerConfig(**{k: v for k, v in settings.items() if k in known and k != "data_dir"})
    addrs = list(args.addr)
    if (args.data_dir / "api.json").exists():
        running = api_client.get(args.url, args.data_dir, "/api/status", prog=prog)["addrs"]
        public = [a for a in running if not a.startswith("/ip4/127.")]
        addrs += public or running
    bootstrap = list(dict.fromkeys([*config.bootstrap, *args.bootstrap]))
    if not bootstrap and not addrs:
        fail(
            prog,
            "the invite would hold no address: start the learner (`echo-learner run`) or pass --addr / --bootstrap",
        )
    print(invites.make(identity, config.job_for(identity.peer_id_str), bootstrap, addrs[:8]))
