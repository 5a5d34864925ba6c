"""``echo-learner``: run the learner of a training job, and look at a running or finished one.

    run      train and serve (the learner itself)
    invite   one line that lets a volunteer join this job (echo-node join <invite>)
    status   the running learner's job, progress and capacity (HTTP API)
    peers    the nodes the running learner knows (HTTP API)
    ledger   the contributor leaderboard (reads the SQLite ledger directly)
    export   the trained model as a Hugging Face directory and a GGUF file (from the checkpoint)
    tasks    the tasks --task can name, or a few prompts of one
    eval     score a checkpoint (or the base model) on the task's held-out prompts

``run`` is here; each other verb is a module of its own, imported once the
arguments parse: ``invite``, ``status_view`` (status and peers, through
``api_client``), ``leaderboard`` (ledger), ``export``, ``tasks.listing``,
``evaluate`` (eval). Heavy libraries (torch, transformers, libp2p) are
imported only after the arguments parse, so ``--help`` and argument errors
are instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from echo_learner.config import LearnerConfig, default_data_dir
from protocol.process.config import Parser, add_arguments, as_dict, fail, resolve_or_exit

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
    _add_run(commands)
    _add_invite(commands)
    _add_readers(commands)
    _add_export(commands)
    _add_tasks(commands)
    _add_eval(commands)
    return parser


Commands = argparse._SubParsersAction  # what add_subparsers returns


def _add_run(commands: Commands) -> None:
    run = commands.add_parser(
        "run",
        help="train and serve until --steps are done (Ctrl-C stops early)",
        description=f"Train and serve. Every setting can also come from the env var "
        f"{ENV_PREFIX}_<NAME> or a TOML file (--config); flags win. A checkpoint is "
        "written every --checkpoint-every steps; --resume continues from it.",
    )
    add_arguments(run, LearnerConfig)
    run.add_argument("-v", "--verbose", action="store_true", help="log every step and refusal")


def _add_reader(commands: Commands, name: str, help_text: str) -> argparse.ArgumentParser:
    """A command that reads the learner's data dir (or its running API)."""
    sub = commands.add_parser(name, help=help_text, description=help_text)
    sub.add_argument(
        "--data-dir",
        type=Path,
        default=default_data_dir(),
        help=f"the learner's data dir (default: {default_data_dir()})",
    )
    sub.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return sub


def _add_invite(commands: Commands) -> None:
    invite = commands.add_parser(
        "invite",
        help="print one line a volunteer pastes to join: echo-node join <invite>",
        description="Print an invite: the job id, this learner's public key and addresses, "
        "and the bootstrap peers, signed by the learner. A node that joins with it needs "
        "nothing else and trusts this learner's key only. Reads --data-dir (where `run` "
        "keeps the identity and settings); a running learner adds the addresses it listens on.",
    )
    invite.add_argument("--data-dir", type=Path, default=default_data_dir(), help="the learner's data dir")
    invite.add_argument(
        "--addr",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="an address at which nodes can reach the learner (e.g. a forwarded port); repeatable",
    )
    invite.add_argument(
        "--bootstrap",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="a bootstrap peer to add to those the learner runs with; repeatable",
    )
    invite.set_defaults(url=None)  # the running learner's API is found through --data-dir


def _add_readers(commands: Commands) -> None:
    for name, help_text in (
        ("status", "show the running learner's job, progress and capacity model"),
        ("peers", "list the nodes the running learner knows"),
    ):
        sub = _add_reader(commands, name, help_text)
        sub.add_argument("--url", default=None, help="status API URL (default: read from --data-dir)")
    ledger = _add_reader(commands, "ledger", "print the contributor leaderboard from the ledger")
    ledger.add_argument("--limit", type=int, default=20, help="rows to show (default: 20)")


def _add_export(commands: Commands) -> None:
    export = commands.add_parser(
        "export",
        help="write the trained model as a Hugging Face directory and a GGUF file",
        description="Write the model of the newest checkpoint in --data-dir, with its "
        "tokenizer, as a Hugging Face directory (loadable with from_pretrained) and as OUT/model.gguf "
        "for llama.cpp (the gguf package: pip install 'echo-swarm[llama]'). A model that came from a "
        "GGUF file keeps that file's tokenizer and chat template.",
    )
    export.add_argument("out", type=Path, help="directory to write (must not exist or be empty)")
    export.add_argument(
        "--gguf-dtype", choices=("f32", "f16", "q8_0"), default="f16", help="weights of the GGUF file (default: f16)"
    )
    export.add_argument("--data-dir", type=Path, default=default_data_dir(), help="the learner's data dir")


def _add_tasks(commands: Commands) -> None:
    tasks = commands.add_parser(
        "tasks",
        help="list the tasks --task can name, or show a few prompts of one",
        description="Without SPEC: every task family (built in, and those installed packages "
        "register under the echo_swarm.tasks entry point group) and reasoning-gym's tasks. "
        "With SPEC: a few training prompts of that task with their expected answers.",
    )
    tasks.add_argument("spec", nargs="?", help="a --task value, e.g. rg:basic_arithmetic:max_terms=3")
    tasks.add_argument("-n", type=int, default=3, help="prompts to show (default: 3)")
    tasks.add_argument("--seed", type=int, default=0, help="seed to draw them with (default: 0)")
    tasks.add_argument("--json", action="store_true", help="print JSON")


def _add_eval(commands: Commands) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="score the newest checkpoint (or --base) on the task's held-out prompts",
        description="Greedy accuracy and pass@1 over -k samples on -n held-out prompts, each with a "
        "95%% confidence interval. Task, model and answer budget are the run's (--data-dir's "
        "config.json) unless given here.",
    )
    evaluate.add_argument("--data-dir", type=Path, default=default_data_dir(), help="the learner's data dir")
    evaluate.add_argument("--base", action="store_true", help="evaluate the model the run starts from")
    evaluate.add_argument("--task", default=None, help="task spec (default: the run's)")
    evaluate.add_argument("--model", default=None, help="model (default: the run's)")
    evaluate.add_argument("-n", type=int, default=200, help="held-out prompts (default: 200)")
    evaluate.add_argument("-k", type=int, default=4, help="samples per prompt for pass@1, 0 for none (default: 4)")
    evaluate.add_argument("--max-new-tokens", type=int, default=0, help="answer budget (default: the run's)")
    evaluate.add_argument("--system-prompt", default="", help="system prompt (default: the run's)")
    evaluate.add_argument("--batch", type=int, default=16, help="sequences generated at once (default: 16)")
    evaluate.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    evaluate.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda", "mps"),
        help="where to generate: auto (a CUDA GPU if torch sees one, else the CPU), cpu, cuda, mps",
    )
    evaluate.add_argument(
        "--temperature", type=float, default=0.0, help="temperature of the pass@1 samples (default: the run's)"
    )
    evaluate.add_argument("--json", action="store_true", help="print JSON")


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        raise SystemExit(2)
    if args.command == "run":
        config = resolve_or_exit(PROG, LearnerConfig, args, ENV_PREFIX)
        run(config, verbose=args.verbose)
    elif args.command == "invite":
        from echo_learner.operator import invite

        invite.command(args, PROG)
    elif args.command in ("status", "peers"):
        from echo_learner.operator import status_view

        status_view.command(args, PROG)
    elif args.command == "ledger":
        from echo_learner.operator import leaderboard

        leaderboard.command(args, PROG)
    elif args.command == "tasks":
        from echo_learner.tasks import listing

        listing.command(args, PROG)
    elif args.command == "eval":
        from echo_learner.training import evaluate

        evaluate.command(args, PROG)
    else:
        from echo_learner.training import export

        export.command(args, PROG)


class StartError(RuntimeError):
    """The data dir and the flags disagree (e.g. a checkpoint but no --resume)."""


def check_data_dir(config: LearnerConfig) -> None:
    """Refuse to resume nothing or to train over a run that was not asked to be
    continued; call before anything is written to the data dir."""
    has_checkpoint = config.checkpoint_path.exists()
    if config.resume and not has_checkpoint:
        raise StartError(f"no checkpoint at {config.checkpoint_path}: nothing to resume")
    if not config.resume and not config.fresh and has_checkpoint:
        raise StartError(
            f"{config.data_dir} holds a checkpoint; pass --resume to continue that run "
            "or --fresh to start a new one (the ledger is kept either way)"
        )


def run(config: LearnerConfig, *, verbose: bool) -> None:
    from protocol.process import logs, malloc

    logs.setup(verbose)
    malloc.limit_arenas()  # before torch and trio start threads

    from echo_learner.tasks.base import TaskError
    from echo_learner.tasks.registry import load_task
    from protocol.net.host import BadMultiaddr, check_addrs, check_tcp_listen

    # What the flags and the data dir say, before torch and the learner are
    # imported (seconds): a mistyped flag is refused at once.
    try:
        check_addrs(config.listen, config.bootstrap)
        check_tcp_listen(
            config.status_host, config.status_port, f"{config.status_host}:{config.status_port} (status page)"
        )
        check_data_dir(config)
        task = load_task(config.task)
    except (BadMultiaddr, StartError, TaskError) as exc:
        fail(PROG, str(exc))

    from echo_learner.service import Learner
    from echo_learner.training.checkpoint import CheckpointError
    from echo_learner.training.device import DeviceUnavailable
    from echo_learner.training.model import ModelError, locate
    from echo_learner.training.train_group import TrainGroupError
    from protocol.identity import Identity, load_or_exit, save
    from protocol.net.swarm import BootstrapUnreachable
    from protocol.process.runtime import run_until_signal

    if config.model:
        try:
            locate(config.model)
        except ModelError as exc:
            fail(PROG, str(exc))
    # A new identity is kept only once the learner could start: a task that
    # does not fit the model leaves the data dir as it was.
    new_identity = not config.identity_path.exists()
    identity = Identity.generate() if new_identity else load_or_exit(PROG, config.identity_path)
    if config.model:
        print(f"loading model {config.model}", flush=True)
    try:
        learner = Learner(config, identity, task)
    except (ModelError, TaskError, DeviceUnavailable, TrainGroupError) as exc:
        fail(PROG, str(exc))
    if new_identity:
        save(identity, config.identity_path)
    (config.data_dir / "config.json").write_text(json.dumps(as_dict(config), indent=2))

    async def main() -> None:
        import trio

        async with trio.open_nursery() as nursery:
            addrs, api_url = await nursery.start(learner.run)
            print(f"learner {identity.peer_id_str} job {learner.job_id} ({config.mode} mode)", flush=True)
            for addr in addrs:
                print(f"listening on {addr}", flush=True)
            print(f"status page: {api_url} (JSON API under /api/, Prometheus metrics at /metrics)", flush=True)

    try:
        stopped = run_until_signal(main)
    except (BadMultiaddr, BootstrapUnreachable, CheckpointError, ModelError, TrainGroupError) as exc:
        fail(PROG, str(exc))
    except OSError as exc:
        fail(PROG, f"cannot start: {exc}")
    c = learner.rollouts.counters
    print(
        f"learner {'stopped' if stopped else 'finished'}: step {learner.step}, version "
        f"{learner.version}, {c.rollouts_accepted} rollouts accepted from "
        f"{len(learner.rollouts.contributors)} nodes, {c.batches_refused} batches refused",
        flush=True,
    )
    sys.exit(0)
