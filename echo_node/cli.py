"""``echo-node``: volunteer your machine to an Echo Swarm training job."""

from __future__ import annotations

import sys

from echo_node.config import NodeConfig
from protocol.config import Parser, add_arguments, fail, resolve_or_exit

PROG = "echo-node"
ENV_PREFIX = "ECHO_NODE"


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG,
        description="Volunteer this machine to an Echo Swarm RL training job: it fetches "
        "the current policy from the swarm, generates rollouts, signs them and sends them "
        "to the job's learner, which credits verified work.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    join = commands.add_parser(
        "join",
        help="join the swarm and work until Ctrl-C",
        description=f"Join the swarm through a bootstrap peer and work until Ctrl-C. Every "
        f"setting can also come from the env var {ENV_PREFIX}_<NAME> or a TOML file "
        f"(--config); flags win.",
    )
    add_arguments(join, NodeConfig)
    join.add_argument("-v", "--verbose", action="store_true", help="log each step of the work loop")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        raise SystemExit(2)
    config = resolve_or_exit(PROG, NodeConfig, args, ENV_PREFIX)
    if not config.bootstrap:
        fail(PROG, "--bootstrap is required: the multiaddr echo-bootstrap printed")
    join(config, verbose=args.verbose)


def join(config: NodeConfig, *, verbose: bool) -> None:
    from protocol import logs

    logs.setup(verbose)

    import trio

    from echo_node.node import NoLearnerFound, Node
    from protocol.host import BadMultiaddr
    from protocol.identity import load_or_exit
    from protocol.runtime import run_until_signal
    from protocol.swarm import BootstrapUnreachable

    identity = load_or_exit(PROG, config.identity_path)
    node = Node(config, identity)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            learner, job = await nursery.start(node.run)
            print(f"node {identity.peer_id_str} joined job {job} (learner {learner})", flush=True)

    try:
        run_until_signal(main)
    except (BadMultiaddr, BootstrapUnreachable, NoLearnerFound) as exc:
        fail(PROG, str(exc))
    print(
        f"node left the swarm: {node.rollouts_sent} rollouts sent, "
        f"{node.receipts_accepted} batches accepted",
        flush=True,
    )
    sys.exit(0)
