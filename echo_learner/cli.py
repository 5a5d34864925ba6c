"""``echo-learner``: run the learner of a training job, and look at a running or finished one.

    run      train and serve (the learner itself)
    invite   one line that lets a volunteer join this job (echo-node join <invite>)
    status   the running learner's job, progress and capacity (HTTP API)
    peers    the nodes the running learner knows (HTTP API)
    ledger   the contributor leaderboard (reads the SQLite ledger directly)
    export   the trained model as a Hugging Face directory and a GGUF file (from the checkpoint)
    tasks    the tasks --task can name, or a few prompts of one
    eval     score a checkpoint (or the base model) on the task's held-out prompts

Heavy libraries (torch, transformers, libp2p) are imported only after the
arguments parse, so ``--help`` and argument errors are instant.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from echo_learner.config import LearnerConfig, default_data_dir
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
        f"{ENV_PREFIX}_<NAME> or a TOML file (--config); flags win. A checkpoint is "
        "written every --checkpoint-every steps; --resume continues from it.",
    )
    add_arguments(run, LearnerConfig)
    run.add_argument("-v", "--verbose", action="store_true", help="log every step and refusal")

    def reader(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "--data-dir",
            type=Path,
            default=default_data_dir(),
            help=f"the learner's data dir (default: {default_data_dir()})",
        )
        sub.add_argument("--json", action="store_true", help="print JSON instead of a table")
        return sub

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
    for name, help_text in (
        ("status", "show the running learner's job, progress and capacity model"),
        ("peers", "list the nodes the running learner knows"),
    ):
        sub = reader(name, help_text)
        sub.add_argument("--url", default=None, help="status API URL (default: read from --data-dir)")
    ledger = reader("ledger", "print the contributor leaderboard from the ledger")
    ledger.add_argument("--limit", type=int, default=20, help="rows to show (default: 20)")
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
    return parser


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
        invite(args)
    elif args.command in ("status", "peers"):
        show(args)
    elif args.command == "ledger":
        ledger(args)
    elif args.command == "tasks":
        from echo_learner.tasks import listing

        listing.command(args, PROG)
    elif args.command == "eval":
        from echo_learner import evaluate

        evaluate.command(args, PROG)
    else:
        export(args)


def run(config: LearnerConfig, *, verbose: bool) -> None:
    from protocol import logs, malloc

    logs.setup(verbose)
    malloc.limit_arenas()  # before torch and trio start threads

    from echo_learner.checkpoint import CheckpointError
    from echo_learner.device import DeviceUnavailable
    from echo_learner.model import ModelError, locate
    from echo_learner.service import Learner, StartError, check_data_dir
    from echo_learner.tasks.base import TaskError
    from echo_learner.tasks.registry import load_task
    from echo_learner.train_group import TrainGroupError
    from protocol.host import BadMultiaddr, check_addrs
    from protocol.identity import Identity, load_or_exit, save
    from protocol.runtime import run_until_signal
    from protocol.swarm import BootstrapUnreachable

    try:
        check_addrs(config.listen, config.bootstrap)
        check_data_dir(config)
        if config.model:
            locate(config.model)
        task = load_task(config.task)
    except (BadMultiaddr, StartError, ModelError, TaskError) as exc:
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
    c = learner.ingest.counters
    print(
        f"learner {'stopped' if stopped else 'finished'}: step {learner.step}, version "
        f"{learner.version}, {c.rollouts_accepted} rollouts accepted from "
        f"{len(learner.ingest.contributors)} nodes, {c.batches_refused} batches refused",
        flush=True,
    )
    sys.exit(0)


def invite(args: argparse.Namespace) -> None:
    from protocol import invite as invites
    from protocol.host import BadMultiaddr, check_addrs
    from protocol.identity import KeyFileError, load

    settings_path = args.data_dir / "config.json"
    try:
        settings = json.loads(settings_path.read_text())
        identity = load(args.data_dir / "identity.key")
    except (OSError, ValueError) as exc:
        fail(PROG, f"{args.data_dir} holds no learner ({exc}); run `echo-learner run` there first")
    except KeyFileError as exc:
        fail(PROG, str(exc))
    try:
        check_addrs(args.addr, args.bootstrap)  # --addr needs no /p2p/ part
    except BadMultiaddr as exc:
        fail(PROG, str(exc))
    known = {f.name for f in fields(LearnerConfig)}
    config = LearnerConfig(**{k: v for k, v in settings.items() if k in known and k != "data_dir"})
    addrs = list(args.addr)
    if (args.data_dir / "api.json").exists():
        running = api_get(args, "/api/status")["addrs"]
        public = [a for a in running if not a.startswith("/ip4/127.")]
        addrs += public or running
    bootstrap = list(dict.fromkeys([*config.bootstrap, *args.bootstrap]))
    if not bootstrap and not addrs:
        fail(
            PROG,
            "the invite would hold no address: start the learner (`echo-learner run`) or pass --addr / --bootstrap",
        )
    print(invites.make(identity, config.job_for(identity.peer_id_str), bootstrap, addrs[:8]))


# --- reading a running learner ---------------------------------------------------


def api_get(args: argparse.Namespace, path: str) -> Any:
    import urllib.error
    import urllib.request

    url = args.url
    if url is None:
        api_file = args.data_dir / "api.json"
        try:
            url = json.loads(api_file.read_text())["url"]
        except (OSError, ValueError, KeyError):
            fail(PROG, f"no running learner found ({api_file} missing); pass --url or --data-dir")
    # A learner bound beyond loopback names its API token in the URL's fragment.
    url, _, fragment = url.partition("#")
    token = fragment.removeprefix("token=") if fragment.startswith("token=") else ""
    request = urllib.request.Request(
        url.rstrip("/") + path, headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        fail(PROG, f"the learner's status API at {url} did not answer: {exc}")


def forecast_check(cap: dict) -> str:
    """How the capacity forecasts of the past minutes fared, in words."""
    if cap.get("forecast_error") is None:
        return "none checked yet (each is checked once its minute has passed)"
    return (
        f"mean error {cap['forecast_error']:.2f}; the last said {cap['last_forecast']:.0%}, "
        f"then {cap['last_measured']:.0%} happened"
    )


def model_alone(cap: dict) -> str:
    """The capacity model's own figure, where the forecast was anchored to measurements."""
    model = cap.get("model_utilization")
    return "" if model is None else f" (the model alone: {model:.0%})"


def show(args: argparse.Namespace) -> None:
    if args.command == "status":
        data = api_get(args, "/api/status")
        if args.json:
            print(json.dumps(data, indent=2))
            return
        cap = data["capacity"]
        m = data["measurements"]
        reward = "-" if data["reward"] is None else f"{data['reward']:.3f}"
        held = data["heldout"]
        if held:
            lo, hi = held["ci95"]
            reward += (
                f"; held-out accuracy {held['accuracy']:.3f} (95% CI {lo:.3f}-{hi:.3f}) at version {held['version']}"
            )
        from protocol.tables import print_fields

        fields = [
            ("job", f"{data['job_id']} ({data['task']}, {data['model']}, {data['parameters']:,} parameters)"),
            ("mode", f"{data['mode']}, staleness {data['staleness']}, publish every {data['publish_every']}"),
            (
                "progress",
                f"step {data['step']}/{data['steps']}, version {data['version']}, "
                f"{data['steps_per_s']:.2f} steps/s, uptime {data['uptime_s']:.0f} s",
            ),
            ("reward", reward),
            (
                "rollouts",
                f"{data['rollouts_accepted']} accepted, {data['batches_refused']} batches refused "
                f"{data['refusals'] or ''}".rstrip(),
            ),
            ("nodes", f"{data['peers']} active, {data['contributors']} contributed"),
            (
                "learner",
                f"utilization {data['utilization']:.0%} (train {m['train_s']:.3f} s/step, "
                f"publish {m['publish_s']:.3f} s, broadcast {m['broadcast_s']:.3f} s)",
            ),
            (
                "capacity",
                f"forecast utilization {cap['utilization']:.0%}{model_alone(cap)}; {cap['verdict']} "
                f"(have {cap['supply_rollouts_per_s']:.1f}, need {cap['needed_rollouts_per_s']:.1f} rollouts/s)",
            ),
            ("forecasts", forecast_check(cap)),
        ]
        for b in data["bootstrap"]:
            state = {None: "not asked yet", True: f"answers ({b['rtt_ms']} ms)"}.get(
                b["answers"], f"NO ANSWER: {b['error']}"
            )
            fields.append(("bootstrap", f"{b['addr']}: {state}"))
        print_fields(fields)
        return
    peers = api_get(args, "/api/peers")["peers"]
    if args.json:
        print(json.dumps(peers, indent=2))
        return
    from protocol.tables import print_table

    def row(p: dict) -> list[object]:
        banned = f" BANNED {p['banned_for_s']:.0f}s" if p["banned_for_s"] else ""
        return [
            "…" + p["peer"][-12:],
            p["backend"],
            p["dtype"],
            p["device"],
            f"{p['memory_mib'] / 1024:.1f}",
            f"{p['tokens_per_s']:.0f}",
            {"private": "behind NAT"}.get(p["reachability"], p["reachability"]),
            "relayed" if p["route"].startswith("relayed") else p["route"],
            p["held_version"],
            f"{p['rollouts_per_s']:.1f}",
            p["accepted"],
            p["refused"],
            f"{p['last_seen_s']:.0f}s",
            p["last_reason"] + banned,
        ]

    columns = (
        "peer",
        "backend",
        "dtype",
        "device",
        "free GiB",
        "tokens/s",
        "reachable",
        "connection",
        "version",
        "rollouts/s",
        "accepted",
        "refused",
        "seen",
        "last verdict",
    )
    numeric = ("free GiB", "tokens/s", "version", "rollouts/s", "accepted", "refused", "seen")
    print_table(columns, (row(p) for p in peers), numeric=numeric)


# --- reading the data dir ---------------------------------------------------------


def ledger(args: argparse.Namespace) -> None:
    import sqlite3
    from dataclasses import asdict

    from echo_learner.ledger import Ledger

    if args.limit < 1:
        fail(PROG, "--limit must be at least 1")
    try:
        db = Ledger(args.data_dir / "ledger.sqlite", readonly=True)
        rows = db.leaderboard(args.limit)
        refusals = db.refusal_counts()
        db.close()
    except (FileNotFoundError, sqlite3.Error) as exc:
        fail(PROG, f"cannot read the ledger: {exc}")
    if args.json:
        print(json.dumps({"contributors": [asdict(r) for r in rows], "refusals": refusals}, indent=2))
        return
    from protocol.tables import print_table

    print_table(
        ("#", "peer", "credit", "tokens", "rollouts", "accepted", "refused"),
        ((i, r.peer, f"{r.credit:.0f}", r.tokens, r.rollouts, r.accepted, r.refused) for i, r in enumerate(rows, 1)),
        numeric=("#", "credit", "tokens", "rollouts", "accepted", "refused"),
    )
    if refusals:
        print("refused: " + ", ".join(f"{k} {v}" for k, v in sorted(refusals.items())))


def write_model_gguf(model: Any, source: str, path: Path, dtype: str) -> None:
    """``model`` as a llama.cpp GGUF file, with the tokenizer of ``source``'s
    GGUF file if it came from one (else the byte vocabulary nodes use)."""
    from echo_learner.model import config_json, locate
    from protocol.gguf_export import write_gguf

    where = locate(source) if source else {}
    tokenizer_from = None
    if "gguf_file" in where:
        tokenizer_from = Path(where["pretrained_model_name_or_path"]) / where["gguf_file"]
    tied = getattr(model.config, "tie_word_embeddings", False)
    tensors = {
        name: value.detach().float().numpy()
        for name, value in model.state_dict().items()
        if not (tied and name == "lm_head.weight")  # llama.cpp ties it back itself
    }
    write_gguf(config_json(model), tensors, path, dtype, tokenizer_from=tokenizer_from)


def export(args: argparse.Namespace) -> None:
    if args.out.exists() and any(args.out.iterdir()):
        fail(PROG, f"{args.out} exists and is not empty")

    from echo_learner import checkpoint
    from echo_learner.model import ModelError, load_model

    started = time.monotonic()
    try:
        state = checkpoint.load(args.data_dir / "checkpoint.pt")
    except checkpoint.CheckpointError as exc:
        fail(PROG, str(exc))
    try:
        model, tokenizer = load_model(state.get("model_source", ""))
    except ModelError as exc:
        fail(PROG, f"cannot rebuild the checkpoint's model: {exc}")
    from echo_learner.lora import restore

    model = restore(model, state)
    args.out.mkdir(parents=True, exist_ok=True)
    if state.get("lora"):
        # The adapter on its own (PEFT's format), then the merged model.
        model.save_pretrained(args.out / "adapter")
        model = model.merge_and_unload()
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    if importlib.util.find_spec("gguf") is None:
        print("no GGUF file written: the gguf package is missing (pip install 'echo-swarm[llama]')", flush=True)
    else:
        write_model_gguf(model, state.get("model_source", ""), args.out / "model.gguf", args.gguf_dtype)
    print(
        f"exported step {state['step']} (version {state['version']}) to {args.out} "
        f"in {time.monotonic() - started:.1f} s",
        flush=True,
    )
