"""``echo-node``: volunteer your machine to an Echo Swarm training job."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from echo_node.config import NodeConfig, default_data_dir
from protocol.process.config import Parser, add_arguments, fail, resolve_or_exit

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
    _add_join(commands)
    _add_credits_and_doctor(commands)
    _add_jobs(commands)
    _add_status(commands)
    add_service_commands(commands)
    return parser


def _add_join(commands: argparse._SubParsersAction) -> None:
    join = commands.add_parser(
        "join",
        help="join the swarm and work until Ctrl-C",
        description=f"Join the swarm and work until Ctrl-C. The simplest start is the invite "
        f"a learner's operator gives out (echo-learner invite): it names the job, the learner "
        f"and the bootstrap peers, and the node then trusts that learner's key only. Bootstrap "
        f"peers can also come from --bootstrap, ECHO_BOOTSTRAP or the TOML file, in that "
        f"order. Every setting can also come from the env var {ENV_PREFIX}_<NAME> or a TOML "
        f"file (--config); flags win.",
    )
    join.add_argument("invite", nargs="?", default=None, help="an invite (echo1:...) from the learner's operator")
    add_arguments(join, NodeConfig)
    join.add_argument("-v", "--verbose", action="store_true", help="log each step of the work loop")


def _add_joining_command(commands: argparse._SubParsersAction, name: str, help_text: str, description: str) -> None:
    """A command that joins the swarm briefly, with join's settings and --json."""
    sub = commands.add_parser(name, help=help_text, description=description)
    sub.add_argument("invite", nargs="?", default=None, help="the invite the node joins with (echo1:...)")
    add_arguments(sub, NodeConfig)
    sub.add_argument("--json", action="store_true", help="print JSON")
    sub.add_argument("-v", "--verbose", action="store_true", help="log details")


def _add_credits_and_doctor(commands: argparse._SubParsersAction) -> None:
    _add_joining_command(
        commands,
        "credits",
        "fetch this node's receipts from the learner and check each signature",
        "Join the swarm, find the learner and fetch every receipt it holds "
        "for this node's identity (--data-dir), checking the learner's signature on each; "
        "print the credit earned. Takes the same settings as join.",
    )
    _add_joining_command(
        commands,
        "doctor",
        "check that this machine can do useful work, and say how to fix what cannot",
        "Check, in plain words with a fix for each failure: the installed backends, "
        "each bootstrap peer, the job's signed record, the learner (and whether we reach it "
        "directly or through a relay), whether other peers can dial this machine (public or "
        "behind NAT), a relay reservation, a TCP hole punch against a public peer, RAM and "
        "disk against the job's model, and a short upload estimate. Exits 0 only when this "
        "node can do useful work. Takes the same settings as join; writes nothing.",
    )


def _add_jobs(commands: argparse._SubParsersAction) -> None:
    jobs = commands.add_parser(
        "jobs",
        help="list the jobs announced in the swarm's DHT, and whether each checks out",
        description="Join the swarm briefly (under a throwaway identity) and list every job "
        "announced in its DHT job directory: the job id, its task, its model, the learner's key "
        "(peer id), how many nodes announce themselves in the job (their own claims, "
        "unverified) and whether the job checks out: its record signed by that learner, its "
        "model config one this node could build. Anyone can announce a job: `echo-node join` "
        "without an invite takes one only when exactly one checks out; pass --job-id or "
        "--learner from this list to choose. Takes join's settings.",
    )
    add_arguments(jobs, NodeConfig)
    jobs.add_argument(
        "--wait-s",
        type=float,
        default=20.0,
        help="while the directory lists no job, look again for up to this long (default: 20)",
    )
    jobs.add_argument("--json", action="store_true", help="print JSON (one object per job, with the reason it fails)")
    jobs.add_argument("-v", "--verbose", action="store_true", help="log details")


def _add_status(commands: argparse._SubParsersAction) -> None:
    status = commands.add_parser(
        "status",
        help="show what the node running with --data-dir is doing",
        description="Show what the node running with this data dir is doing: its job and "
        "learner, the weights it holds, whether other peers can dial it (public, or behind "
        "NAT), its neighbours and its work so far.",
    )
    status.add_argument(
        "--data-dir",
        type=Path,
        default=default_data_dir(),
        help=f"the node's data dir (default: {default_data_dir()})",
    )
    status.add_argument("--json", action="store_true", help="print JSON")


def add_service_commands(commands: argparse._SubParsersAction) -> None:
    service = commands.add_parser(
        "service",
        help="start this node at login (a systemd user unit on Linux, a launchd agent on macOS)",
        description="Install or remove a service that runs `echo-node join` at every login, at low "
        "priority (nice 10, idle I/O), restarted when it fails, within the caps given.",
    )
    actions = service.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser, required=True)
    for name, help_text in (
        ("install", "write the unit (or agent) and start it now and at every login"),
        ("uninstall", "stop the service and remove its unit (or agent); the node's data dir stays"),
    ):
        sub = actions.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "--platform",
            choices=("auto", "systemd", "launchd"),
            default="auto",
            help="auto: systemd on Linux, launchd on macOS",
        )
        sub.add_argument(
            "--dir",
            type=Path,
            default=None,
            help="where the unit goes (default: ~/.config/systemd/user or ~/Library/LaunchAgents)",
        )
        sub.add_argument(
            "--no-enable",
            action="store_true",
            help="only write (or remove) the file; do not call systemctl or launchctl",
        )
        if name == "install":
            sub.add_argument(
                "--cpu-percent",
                type=float,
                default=0.0,
                help="cap CPU at this percent of one core, e.g. 150 for 1.5 cores (systemd; 0: none)",
            )
            sub.add_argument("--memory-gib", type=float, default=0.0, help="cap memory at this many GiB (0: none)")
            sub.add_argument(
                "join_args",
                nargs=argparse.REMAINDER,
                metavar="-- JOIN-ARGS",
                help="what `echo-node join` gets, after --: the invite and/or its settings",
            )


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        raise SystemExit(2)
    if args.command == "status":
        show_status(args)
        return
    if args.command == "service":
        service(args)
        return
    # ECHO_BOOTSTRAP (shared by every Echo Swarm command) ranks between the
    # flag and the TOML file, like our own variables.
    if os.environ.get("ECHO_BOOTSTRAP") and not os.environ.get(f"{ENV_PREFIX}_BOOTSTRAP"):
        os.environ[f"{ENV_PREFIX}_BOOTSTRAP"] = os.environ["ECHO_BOOTSTRAP"]
    config = resolve_or_exit(PROG, NodeConfig, args, ENV_PREFIX)
    config, learner_addrs = apply_invite(config, getattr(args, "invite", None))
    if not config.bootstrap and not config.mdns:
        fail(
            PROG,
            "no bootstrap peer: paste the invite the learner's operator gave you "
            "(echo-node join echo1:...), or pass --bootstrap ADDR (or set ECHO_BOOTSTRAP)",
        )
    if not config.bootstrap:
        print("no bootstrap peer given: looking for a learner on the local network (mDNS)", flush=True)
    if args.command == "jobs":
        list_jobs(config, args.wait_s, as_json=args.json, verbose=args.verbose)
    elif args.command == "credits":
        credits(config, learner_addrs, as_json=args.json, verbose=args.verbose)
    elif args.command == "doctor":
        doctor(config, learner_addrs, as_json=args.json, verbose=args.verbose)
    else:
        join(config, learner_addrs, verbose=args.verbose)


def service(args: argparse.Namespace) -> None:
    from echo_node import service_unit

    platform = args.platform
    if platform == "auto":
        platform = {"linux": "systemd", "darwin": "launchd"}.get(sys.platform)
        if platform is None:
            fail(PROG, f"no service support on {sys.platform}: run `echo-node join ...` from its own scheduler")
    where = args.dir or service_unit.default_dir(platform)
    try:
        if args.action == "uninstall":
            path = service_unit.uninstall(platform, where, enable=not args.no_enable)
            print(f"removed {path}", flush=True)
            return
        join_args = args.join_args[1:] if args.join_args[:1] == ["--"] else args.join_args
        check_join_args(join_args)
        limits = service_unit.Limits(cpu_percent=args.cpu_percent, memory_gib=args.memory_gib)
        if limits.cpu_percent < 0 or limits.memory_gib < 0:
            fail(PROG, "--cpu-percent and --memory-gib must be 0 (no cap) or more")
        path = service_unit.install(platform, join_args, limits, where, enable=not args.no_enable)
    except service_unit.ServiceError as exc:
        fail(PROG, str(exc))
    started = "written (not enabled: --no-enable)" if args.no_enable else "installed and started; it starts at login"
    print(f"{path}: {started}", flush=True)


def check_join_args(join_args: list[str]) -> None:
    """Refuse what `echo-node join` would refuse, before a service runs it in a loop."""
    args = build_parser().parse_args(["join", *join_args])  # exits with join's usage error
    config = resolve_or_exit(PROG, NodeConfig, args, ENV_PREFIX)
    config, _ = apply_invite(config, args.invite)
    if not config.bootstrap and not config.mdns:
        fail(PROG, "the service needs a bootstrap peer: pass the invite or --bootstrap after --")


def apply_invite(config: NodeConfig, text: str | None) -> tuple[NodeConfig, tuple[str, ...]]:
    """The settings with the invite's job, learner and bootstrap peers added,
    and where the learner listens; exits with one line on a bad invite."""
    if text is None:
        return config, ()
    from protocol.invite import BadInvite, parse

    try:
        invite = parse(text)
    except BadInvite as exc:
        fail(PROG, str(exc))
    if config.learner and config.learner != invite.learner_id:
        fail(PROG, f"--learner {config.learner} contradicts the invite's learner {invite.learner_id}")
    if config.job_id and config.job_id != invite.job_id:
        fail(PROG, f"--job-id {config.job_id} contradicts the invite's job {invite.job_id}")
    bootstrap = list(dict.fromkeys([*config.bootstrap, *invite.bootstrap]))
    config = replace(config, bootstrap=bootstrap, learner=invite.learner_id, job_id=invite.job_id)
    return config, invite.learner_addrs


def doctor(config: NodeConfig, learner_addrs: tuple[str, ...], *, as_json: bool, verbose: bool) -> None:
    from protocol.process import logs

    logs.setup(verbose)

    import json

    import trio

    from echo_node.doctor import describe, diagnose, report
    from protocol.net.host import BadMultiaddr, check_addrs

    try:
        check_addrs(config.listen, config.bootstrap)
    except BadMultiaddr as exc:
        fail(PROG, str(exc))
    # Short enough to answer in about a minute when things are broken.
    config = replace(config, discovery_timeout_s=min(config.discovery_timeout_s, 20.0))
    checks = trio.run(diagnose, config, learner_addrs, 10.0)
    print(json.dumps(report(checks), indent=2) if as_json else describe(checks), flush=True)
    sys.exit(0 if report(checks)["ok"] else 1)


def list_jobs(config: NodeConfig, wait_s: float, *, as_json: bool, verbose: bool) -> None:
    from protocol.process import logs

    logs.setup(verbose)

    import json

    import trio

    from echo_node.jobs import look, print_jobs
    from protocol.net.host import BadMultiaddr, check_addrs
    from protocol.net.swarm import BootstrapUnreachable

    if wait_s < 0:
        fail(PROG, "--wait-s must be 0 or more")
    try:
        check_addrs(config.listen, config.bootstrap)
        jobs = trio.run(look, config, wait_s)
    except (BadMultiaddr, BootstrapUnreachable) as exc:
        fail(PROG, str(exc))
    if as_json:
        print(json.dumps([j.as_json() for j in jobs], indent=2))
    elif not jobs:
        print("no job is announced in the DHT", flush=True)
    else:
        print_jobs(jobs)
    sys.exit(0)


def show_status(args: argparse.Namespace) -> None:
    import json

    from echo_node import status

    try:
        data = status.read(args.data_dir / "status.json")
    except status.NotRunning as exc:
        fail(PROG, str(exc))
    print(json.dumps(data, indent=2) if args.json else status.describe(data))


def join(config: NodeConfig, learner_addrs: tuple[str, ...], *, verbose: bool) -> None:
    from protocol.process import logs, malloc

    logs.setup(verbose)
    malloc.limit_arenas()  # before torch and trio start threads

    import trio

    from echo_node.backend_choice import BackendUnavailable, choose
    from echo_node.learner_lookup import NoLearnerFound
    from echo_node.node import Node
    from echo_node.refusals import Refused
    from protocol.identity import load_or_exit
    from protocol.messages import MAX_NAME
    from protocol.net.host import BadMultiaddr, check_addrs
    from protocol.net.swarm import BootstrapUnreachable
    from protocol.process.runtime import run_until_signal

    if len(config.name) > MAX_NAME:
        fail(PROG, f"--name is {len(config.name)} characters; at most {MAX_NAME}")
    try:
        check_addrs(config.listen, config.bootstrap)
        backend, why = choose(config.backend, config.dtype, config.threads, config.gguf_dir, config.device)
    except (BadMultiaddr, BackendUnavailable) as exc:
        fail(PROG, str(exc))
    print(f"backend: {backend.name} {'dtype auto' if backend.auto_dtype else backend.dtype} ({why})", flush=True)
    if backend.device.gpu:
        # A GPU backend that crashes or stalls does so at its first load:
        # tried on a tiny model in a child process first, it is one line here.
        from echo_node.backend_trial import try_backend

        trial = try_backend(backend.name, config.dtype, backend.device.kind)
        if not trial.ok:
            fail(PROG, trial.line)
        print(f"gpu: {trial.line}", flush=True)
    identity = load_or_exit(PROG, config.identity_path)
    node = Node(config, identity, backend, learner_addrs)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            learner, job = await nursery.start(node.run)
            print(f"node {identity.peer_id_str} joined job {job} (learner {learner})", flush=True)

    try:
        run_until_signal(main)
    except (BadMultiaddr, BootstrapUnreachable, NoLearnerFound, Refused) as exc:
        fail(PROG, str(exc))  # Refused: the job's model does not fit this machine
    finally:
        backend.close()
    print(
        f"node left the swarm: {node.rollouts_sent} rollouts sent, {node.receipts_accepted} batches accepted",
        flush=True,
    )
    sys.exit(0)


def credits(config: NodeConfig, learner_addrs: tuple[str, ...], *, as_json: bool, verbose: bool) -> None:
    from protocol.process import logs

    logs.setup(verbose)

    import json

    from echo_node import receipts, status
    from echo_node.learner_lookup import NoLearnerFound
    from echo_node.node import Node
    from protocol.identity import load_or_exit
    from protocol.net.host import BadMultiaddr, any_port
    from protocol.net.swarm import BootstrapUnreachable
    from protocol.process.runtime import run_until_signal
    from protocol.rpc import RequestFailed

    if not config.identity_path.exists():
        fail(PROG, f"no node identity at {config.identity_path}: this data dir never joined a job")
    identity = load_or_exit(PROG, config.identity_path)
    if status.running(config.status_path) is not None:
        # The node holds its port; the learner keeps the node's connection
        # beside ours (protocol.net.host.keep_connection).
        config = replace(config, listen=[any_port(addr) for addr in config.listen])
    node = Node(config, identity, learner_addrs=learner_addrs)
    held = []

    async def main() -> None:
        async with node.joined(keep_waiting=False):
            held.extend(await node.fetch_receipts())

    try:
        run_until_signal(main)
    except (BadMultiaddr, BootstrapUnreachable, NoLearnerFound, RequestFailed) as exc:
        fail(PROG, str(exc))
    learner = node.learner.to_base58() if node.learner else ""
    summary = receipts.credit_summary(held, peer=identity.peer_id_str, job_id=node.job_id, learner=learner)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        receipts.print_credit_summary(summary)
    sys.exit(0)
