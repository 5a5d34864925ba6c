"""``echo-learner``: run the learner of a training job.

Heavy libraries (torch, transformers, libp2p) are imported only after the
arguments parse, so ``--help`` and argument errors are instant.
"""

from __future__ import annotations

import json
import sys

from echo_learner.config import LearnerConfig
from protocol.config import Parser, add_arguments, as_dict, fail, resolve_or_exit

PROG = "echo-learner"
ENV_PREFIX = "ECHO_LEARNER"


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG,
        description="The learner of an Echo Swarm job: hands out prompts, verifies and "
        "credits the rollouts volunteers send, trains the policy with GRPO and publishes "
        "each new version to the swarm.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    run = commands.add_parser(
        "run",
        help="train and serve until --steps are done (Ctrl-C stops early)",
        description=f"Train and serve. Every setting can also come from the env var "
        f"{ENV_PREFIX}_<NAME> or a TOML file (--config); flags win.",
    )
    add_arguments(run, LearnerConfig)
    run.add_argument("-v", "--verbose", action="store_true", help="log every step and refusal")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        raise SystemExit(2)
    config = resolve_or_exit(PROG, LearnerConfig, args, ENV_PREFIX)
    run(config, verbose=args.verbose)


def run(config: LearnerConfig, *, verbose: bool) -> None:
    from protocol import logs

    logs.setup(verbose)

    from echo_learner.service import Learner
    from protocol.host import BadMultiaddr
    from protocol.identity import load_or_exit
    from protocol.runtime import run_until_signal
    from protocol.swarm import BootstrapUnreachable

    identity = load_or_exit(PROG, config.identity_path)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    (config.data_dir / "config.json").write_text(json.dumps(as_dict(config), indent=2))
    learner = Learner(config, identity)

    async def main() -> None:
        import trio

        async with trio.open_nursery() as nursery:
            addrs = await nursery.start(learner.run)
            print(f"learner {identity.peer_id_str} job {learner.job_id}", flush=True)
            for addr in addrs:
                print(f"listening on {addr}", flush=True)

    try:
        stopped = run_until_signal(main)
    except (BadMultiaddr, BootstrapUnreachable) as exc:
        fail(PROG, str(exc))
    print(
        f"learner {'stopped' if stopped else 'finished'}: version {learner.version}, "
        f"{learner.rollouts_accepted} rollouts accepted from {len(learner.contributors)} nodes",
        flush=True,
    )
    sys.exit(0)
