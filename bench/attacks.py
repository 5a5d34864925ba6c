"""Hostile peers against a real swarm: how much honest work survives each attack.

Each scenario runs a fresh swarm of real processes on 127.0.0.1 (bootstrap,
learner, 3 honest nodes), waits until every honest node has had a batch
accepted, starts one attack (bench/attacker.py, its own process under
SCHED_IDLE and capped at ``--attacker-cores`` by a cgroup: a real attacker
burns its own machine's CPU, not ours; see ``confine.cpu_cap``), and counts
the honest nodes' accepted batches and their tokens in the learner's ledger
over ``--window-s`` seconds. With ``--pin`` (the default) the learner has
the first core to itself and everything else shares the rest (see
``cores_of``). Every scenario runs once per learner mode
(``--modes``: sync, then async; the learner's and nodes' default limits).
The baseline is the same swarm with no attacker, run first and again after
every two scenarios, and ``honest_retained`` is an attack's honest
accepted batches per second over the mean of the two baselines beside it,
each carried to the attack's answer length (``length_model``: the policy's
answers shorten as it learns, and a batch's cost with them) and to the
machine's speed during the attack's window. This machine's cores run
+-15 % faster or slower over minutes, whatever runs on them (the host's
other tenants): a probe in the bench's own process times a fixed piece of
work on every core twice a second (``observe.SpeedProbe``, ``slowness_ms``),
and a baseline that ran while the probe's work took 2.0 ms is carried to an
attack that ran while it took 2.5 ms at 0.8 of its rate. Over 20-s blocks of
one 300-s baseline swarm the probe's speed and the honest batch rate
correlated 0.87 (async) and 0.60 (sync), and carrying the rate to one speed
cut the blocks' cv from 0.087 to 0.046 and from 0.075 to 0.058 (2026-12-01).
``unadjusted_retained`` is the same verdict without the speed.
An attack's first try is its verdict: with ``--rerun-misses`` a
missed one runs once more between two fresh baselines, and that try is
reported beside it (``rerun``) but decides nothing. A control scenario
(eight peers that join and ask for nothing; the window opens once all have
joined) shows what the attacker's presence alone costs on this machine;
with the baselines' coefficient of
variation (``baseline_cv``) it says whether the run could tell an attack
from noise (``steady``: every control joined and read 0.9-1.1, every cv <= 0.10;
the cv of the baselines' batch rates at one answer length and speed, with
``tokens_cv`` and ``batches_cv`` unadjusted beside it).

Also checked per scenario: no honest process died, and every receipt an
honest node holds has its row in the learner's ledger (``ledger_consistent``).
``learner_cpu_per_batch_ratio`` (the learner's CPU per accepted honest batch
during the scenario over the same in the baselines beside it) tells what an
attack costs the learner from what the attacker process took of this
machine's cores (``cpu_cores``); ``honest_cpu_ms_per_batch`` (the honest
processes' CPU over their accepted batches) tells an attack's cost apart
from a scenario this machine ran slowly; ``machine`` (where the machine's
CPU time went: busy, disk wait, taken by the host) and ``learner`` (its
event loop's lateness, steps and refusals, read from its status API each
second) say why a scenario ran slowly.

    python bench/attacks.py --json            # ~65 minutes on 2 cores (both modes)
    python bench/attacks.py --only work_flood --modes async  # one attack, one mode (and the baselines)
    python bench/attacks.py --only idle_members  # the baselines and the control alone

Targets (issues 14, 40 and 55): ``honest_retained >= 0.8`` for every attack
in both modes, ``>= 0.9`` for api_pollers, with every honest process alive,
no honest node stopped, the ledger consistent and the attack ``engaged``
(its own counters show it did what it is: ``ENGAGED``); relay_exhaustion
also ``honest_reserved`` true. ``all_met_first_try`` says all of them held.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from attack_catalog import (  # noqa: E402
    ATTACKS,
    BEFORE_JOIN,
    CONTROL,
    CORES,
    HELD,
    UNCAPPED,
    took_hold,
)
from confine import attacker_limits, confine, cpu_cap  # noqa: E402
from harness import accepted_in, ledger_verdicts, node_receipts  # noqa: E402
from localswarm import LocalSwarm, local_swarm  # noqa: E402
from observe import (  # noqa: E402
    SpeedProbe,
    StatusSampler,
    control_ms,
    cpu_s,
    json_reports,
    machine_shares,
    machine_times,
)
from relay_probe import ProbeProcess  # noqa: E402
from standing_relay import StandingRelay  # noqa: E402
from swarmproc import free_port  # noqa: E402
from verdict import carried, coefficient_of_variation, judged, length_model, mean_slowness  # noqa: E402

from protocol.identity import load_or_create  # noqa: E402

HONEST = 3
ATTACKER = Path(__file__).resolve().parent / "attacker.py"

BASELINE_EVERY = 2  # scenarios between two baselines
MAX_BASELINE_CV = 0.10  # issue 55: a run whose baselines spread wider cannot judge an attack at 0.8


def accepted_since(ledger: Path, peers: set[str], since_ms: int, until_ms: int) -> int:
    return sum(batches for peer, (batches, _) in accepted_in(ledger, since_ms, until_ms).items() if peer in peers)


def cap_group(name: str, args: argparse.Namespace) -> Path | None:
    """The cgroup capping attack ``name``'s CPU (``CORES``, else ``--attacker-cores``)."""
    return cpu_cap(CORES[name]) if name in CORES else args.cap_group


def cores_of(pin: bool) -> dict[str, set[int]]:
    """With ``--pin``: the learner alone on the first core, every other
    process (bootstrap, honest nodes, attacker) on the rest.

    Why: in async mode the learner is what sets the pace, one core's worth of
    work (0.97-0.99 of a core in every baseline of 2026-11-29), as it would
    on a machine of its own; unpinned it shared both cores with everything
    else, and its share moved with where the scheduler put the others. It
    still runs slower when the core beside it is busier (see UNCAPPED in
    attack_catalog.py): ``learner_control_ratio`` tells that apart.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return {}
    learner, rest = {cpus[0]}, set(cpus[1:])
    return {"learner": learner, "bootstrap": rest, "attacker": rest} | {f"node{i}": rest for i in range(HONEST)}


def last_report(attack_log: Path) -> dict:
    """The attacker's newest counters (it prints them every few seconds)."""
    return (json_reports(attack_log) or [{}])[-1]


def wait_for(what: str, done, timeout_s: float, swarm: LocalSwarm) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        dead = {n: p.returncode for n, p in swarm.procs.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"{what}: processes exited: {dead}; logs in {swarm.root}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s} s; logs in {swarm.root}")
        time.sleep(0.5)  # polling another process's files: there is no event to await


def ledger_consistent(swarm: LocalSwarm, ledger: Path) -> bool:
    """Every receipt an honest node wrote down has the same verdict in the ledger."""
    verdicts = dict(ledger_verdicts(ledger))
    return all(
        verdicts.get(r["batch_hash"]) == r["verdict"]
        for i in range(HONEST)
        for r in node_receipts(swarm.root / f"node{i}")
    )


def scenario(name: str, mode: str, args: argparse.Namespace, root: Path, relay: StandingRelay | None = None) -> dict:
    """One swarm (the learner in ``mode``: sync or async), optionally one
    attack; the honest accepted batches and their tokens. ``relay``:
    relay_exhaustion's bootstrap peer and probe, up since the mode began."""
    with local_swarm(root) as swarm:
        swarm.cpus = cores_of(args.pin)
        if relay is not None:
            swarm.bootstrap_addr = relay.addr
        else:
            swarm.start_bootstrap()
        learner_port, api_port = free_port(), free_port()
        swarm.listen = f"/ip4/127.0.0.1/tcp/{learner_port}"
        swarm.start_learner("--steps", "1000000", "--status-port", str(api_port), "--mode", mode)
        swarm.listen = "/ip4/127.0.0.1/tcp/0"
        ledger = root / "learner" / "ledger.sqlite"
        honest = {load_or_create(root / f"node{i}" / "identity.key").peer_id_str for i in range(HONEST)}
        wait_for("learner up", (root / "learner" / "api.json").exists, 120, swarm)

        attacker = None
        probe: ProbeProcess | None = None
        attack_log = root / "attacker.log"

        def start_attack() -> subprocess.Popen:
            fill = {"learner": f"127.0.0.1:{learner_port}", "api": f"127.0.0.1:{api_port}"}
            extra = [a.format(**fill) for a in ATTACKS[name]]
            return subprocess.Popen(
                [
                    sys.executable,
                    str(ATTACKER),
                    name,
                    "--bootstrap",
                    swarm.bootstrap_addr,
                    "--data-dir",
                    str(root / "attacker"),
                    *extra,
                ],
                stdout=open(attack_log, "w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=attacker_limits(
                    None if name in UNCAPPED | HELD else cap_group(name, args), swarm.cpus.get("attacker")
                ),
            )

        try:
            if name in BEFORE_JOIN:
                if relay is not None:
                    # An honest peer of its own process, known to the relay
                    # before the crowd comes; it asks once the crowd has tried.
                    probe = relay.probe
                    if not args.json and relay.left_s() > 0:
                        print(
                            f"  waiting {relay.left_s():.0f} s for the probe to be known", file=sys.stderr, flush=True
                        )
                    wait_for("the probe to be known to the relay", probe.known, relay.left_s() + 120, swarm)
                attacker = start_attack()
                # In place before anyone joins (e.g. decoy jobs already
                # listed): its reports say it took hold.
                wait_for("the attack to take hold", lambda: took_hold(name, last_report(attack_log)), 120, swarm)
                if probe is not None:
                    probe.crowd_tried()
                if name in HELD:
                    confine(attacker.pid, cap_group(name, args))
            for i in range(HONEST):
                swarm.start_node(i, "--name", f"honest{i}")
            wait_for(
                "every honest node has a batch accepted",
                lambda: all(accepted_since(ledger, {p}, 0, 2**62) > 0 for p in honest),
                args.join_timeout_s,
                swarm,
            )
            if attacker is None and name != "baseline":
                attacker = start_attack()
            time.sleep(args.settle_s)  # let the attack take hold: it is measured, not awaited
            pids = {n: p.pid for n, p in swarm.procs.items()} | ({"attacker": attacker.pid} if attacker else {})
            cpu_before = {n: cpu_s(pid) for n, pid in pids.items()}
            machine_before = machine_times()
            start_ms = int(time.time() * 1000)
            with StatusSampler(api_port) as sampler, SpeedProbe(os.sched_getaffinity(0)) as speed:
                time.sleep(args.window_s)
            end_ms = int(time.time() * 1000)
            machine = machine_shares(machine_before, machine_times())
            # Where the machine's CPU went during the window (cores busy, per process).
            cpu = {n: round((cpu_s(pid) - cpu_before[n]) / args.window_s, 2) for n, pid in pids.items()}
            accepted = accepted_since(ledger, honest, start_ms, end_ms)
            tokens = sum(t for peer, (_, t) in accepted_in(ledger, start_ms, end_ms).items() if peer in honest)
            alive = all(swarm.procs[n].poll() is None for n in swarm.procs)
            stopped = sum(swarm.procs[f"node{i}"].poll() is not None for i in range(HONEST))
            honest_reserved = probe.reserved() if probe is not None else None
        finally:
            if attacker is not None:
                attacker.kill()
                attacker.wait()
            if probe is not None:
                probe.stop()
        codes = swarm.stop_all()
    report = last_report(attack_log)
    learner = sampler.summary()
    return {
        "attacker_capped": attacker is not None and cap_group(name, args) is not None and name not in UNCAPPED,
        **({"attacker_cores_cap": CORES[name]} if name in CORES else {}),
        "accepted_batches": accepted,
        "rate_per_s": round(accepted / args.window_s, 3),
        # The tokens in those batches: as the policy learns, its answers
        # shorten (150 to 20-50 tokens a batch within three minutes of one
        # run), and a batch's cost with them.
        "tokens_per_batch": round(tokens / accepted, 1) if accepted else None,
        # Reported beside the verdict (``tokens_retained``, ``tokens_cv``).
        "tokens_per_s": round(tokens / args.window_s, 1),
        # How slowly this machine ran during the window (``observe.SpeedProbe``):
        # rates are judged against baselines carried to the same speed.
        "slowness_ms": speed.slowness(),
        "slowness_ms_by_cpu": speed.summary()["slowness_ms_by_cpu"],
        "honest_alive": alive,
        "nodes_stopped": stopped,  # honest node processes that exited (e.g. on a decoy job)
        "clean_exit": all(c == 0 for c in codes.values()),
        "ledger_consistent": ledger_consistent(swarm, ledger),
        "cpu_cores": cpu,
        "machine": machine,
        "learner": learner,
        # What each accepted honest batch cost the honest processes: it moves
        # with an attack's cost, not with how much CPU this machine gave the
        # swarm (a scenario whose whole swarm ran at half speed kept it).
        # The learner's own CPU per accepted honest batch: an attack that
        # makes the learner work shows here, whatever the attacker process
        # took from this machine's cores.
        "learner_cpu_ms_per_batch": round(1000 * cpu["learner"] / (accepted / args.window_s), 1) if accepted else None,
        "learner_cpu_us_per_token": round(1e6 * cpu["learner"] / (tokens / args.window_s), 1) if tokens else None,
        # Of that, what the control plane took (every phase but recompute and
        # training): what an attack's messages make the learner do. The
        # model's work per batch is the same whatever the attack, and took
        # longer only when this machine's other core was busier (see UNCAPPED).
        "learner_control_ms_per_batch": control_ms(learner) if learner.get("cpu_ms_per_batch") else None,
        "honest_cpu_ms_per_batch": (
            round(1000 * sum(c for n, c in cpu.items() if n != "attacker") / (accepted / args.window_s))
            if accepted
            else None
        ),
        **({"attacker": report} if attack_log.exists() else {}),
        # relay_exhaustion: a peer connected long enough to be known got a
        # reservation at every try during the attack (bench/relay_probe.py).
        **({"honest_reserved": honest_reserved} if honest_reserved is not None else {}),
    }


def run_mode(mode: str, names: list[str], args: argparse.Namespace, root: Path) -> dict:
    """Every scenario of ``names`` (and the control) with the learner in ``mode``."""
    timeline: list[tuple[str, dict]] = []  # every scenario run, in order
    relays: list[StandingRelay] = []

    def standing_relay() -> StandingRelay:
        relays.append(StandingRelay(root / f"{mode}-relay{len(relays)}", cores_of(args.pin).get("bootstrap")))
        return relays[-1]

    def run(name: str) -> dict:
        if not args.json:
            print(f"{mode} {name} ...", file=sys.stderr, flush=True)
        # relay_exhaustion's relay, known to its probe by now (a rerun's: by the time it is).
        relay = None if name != "relay_exhaustion" else relays.pop() if relays else standing_relay()
        try:
            result = scenario(name, mode, args, root / f"{mode}-{len(timeline):02d}-{name}", relay)
        finally:
            if relay is not None:
                relay.close()
        if not args.json:
            print(f"  {json.dumps(result)}", file=sys.stderr, flush=True)
        timeline.append((name, result))
        return result

    if "relay_exhaustion" in names:
        standing_relay()
    try:
        return judge_mode(names, args, timeline, run)
    finally:
        for relay in relays:
            relay.close()


def judge_mode(names: list[str], args: argparse.Namespace, timeline: list[tuple[str, dict]], run) -> dict:
    """Run every scenario of ``names`` (and the control) with ``run``
    (which adds each to ``timeline``), between baselines, and judge each."""
    # This machine's speed drifts by minutes (baselines of one run 3.6 and
    # 6.05 batches/s; a run where the whole honest swarm ran at half its CPU
    # for three scenarios in a row, the attacker idle): each attack is judged
    # against the baselines beside it, one after every BASELINE_EVERY.
    run("baseline")
    pending = [CONTROL, *names]
    beside: list[tuple[str, dict, dict, dict]] = []  # (name, result, baseline before, baseline after)
    while pending:
        group, pending = pending[:BASELINE_EVERY], pending[BASELINE_EVERY:]
        before = timeline[-1][1]
        results = [(name, run(name)) for name in group]
        after = run("baseline")
        beside += [(name, result, before, after) for name, result in results]
    model = length_model([r for n, r in timeline if n == "baseline"])
    for name, result, before, after in beside:
        judged(name, result, before, after, model)
    control = next(r for n, r in timeline if n == CONTROL)
    attacks = {n: r for n, r in timeline if n in names}
    # A rerun of a miss between two fresh baselines (the last scenario run is
    # one) is reported, never used to pass: over five full runs, 7 of 9 first
    # misses passed on their rerun, so a rerun that decided hid what the
    # first try showed.
    for name in [n for n, r in attacks.items() if not r["met"] and args.rerun_misses]:
        before = timeline[-1][1]
        rerun = run(name)
        attacks[name]["rerun"] = judged(name, rerun, before, run("baseline"), model)
    baselines = [r for n, r in timeline if n == "baseline"]
    rates = [b["tokens_per_s"] for b in baselines]
    # What the verdict compares: each baseline's batch rate at the
    # baselines' mean answer length and machine speed.
    middle = {
        "tokens_per_batch": statistics.mean(b["tokens_per_batch"] or 0.0 for b in baselines),
        "slowness_ms": mean_slowness(baselines),
    }
    return {
        # Every baseline, in the order run; each attack names its own
        # reference (``baseline_rate_per_s``: the two beside it, at its
        # answer length and machine speed).
        "baseline": {
            "tokens_per_s": round(statistics.mean(rates), 1),
            "seconds_per_batch": {"a": round(model[0], 5), "per_token": round(model[1], 6)},
            "slowness_ms": round(middle["slowness_ms"], 3) if middle["slowness_ms"] else None,
            "cv": coefficient_of_variation([carried(b, middle, model) for b in baselines]),
            # The same spread unadjusted, in tokens/s and in batches/s.
            "tokens_cv": coefficient_of_variation(rates),
            "batches_cv": coefficient_of_variation([b["rate_per_s"] for b in baselines]),
            "runs": baselines,
        },
        # Not an attack: peers that join and ask for nothing, run like one.
        # What they cost is what the attacker process's mere presence costs here.
        "control_idle_members": control,
        "attacks": attacks,
        "all_met": all(r["met"] for r in attacks.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(ATTACKS),
        help=f"run just these attacks ({CONTROL}: only the baselines and the control)",
    )
    parser.add_argument(
        "--modes",
        default="sync,async",
        help="the learner's training modes to run every scenario in, comma-separated (sync, async)",
    )
    parser.add_argument("--window-s", type=float, default=40.0, help="measurement window per scenario")
    parser.add_argument("--settle-s", type=float, default=8.0, help="attack running before the window opens")
    parser.add_argument("--join-timeout-s", type=float, default=180.0)
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the learner alone on the first core, the rest on the others (see cores_of)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's logs (printed path)")
    parser.add_argument(
        "--rerun-misses",
        action="store_true",
        help="run a missed attack a second time between fresh baselines, to report (the first try decides)",
    )
    parser.add_argument(
        "--attacker-cores",
        type=float,
        default=0.1,
        help="CPU cap for the attacker process (cgroup; 0: SCHED_IDLE only)",
    )
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"sync", "async"}:
        parser.error(f"--modes: a comma-separated list of sync and async, not {args.modes!r}")
    args.cap_group = cpu_cap(args.attacker_cores) if args.attacker_cores > 0 else None

    root = Path(tempfile.mkdtemp(prefix="echo-attacks-"))
    names = [n for n in (args.only or ATTACKS) if n != CONTROL]
    started = time.monotonic()
    runs = {mode: run_mode(mode, names, args, root) for mode in modes}
    out = {
        "honest_nodes": HONEST,
        "window_s": args.window_s,
        "attacker_cores_cap": args.attacker_cores if args.cap_group is not None else None,
        # The verdict: every attack met its target on its first try, in every mode.
        "all_met_first_try": all(r["all_met"] for r in runs.values()),
        # Whether this run could tell an attack from noise: the control read
        # 0.9-1.1 and the baselines' coefficient of variation stayed <= 0.10.
        "control_retained": {m: r["control_idle_members"]["honest_retained"] for m, r in runs.items()},
        "baseline_cv": {m: r["baseline"]["cv"] for m, r in runs.items()},
        "steady": all(
            r["control_idle_members"]["engaged"]
            and 0.9 <= r["control_idle_members"]["honest_retained"] <= 1.1
            and r["baseline"]["cv"] is not None
            and r["baseline"]["cv"] <= MAX_BASELINE_CV
            for r in runs.values()
        ),
        "modes": runs,
        "cpus": os.cpu_count(),
        "wall_s": round(time.monotonic() - started, 1),
    }
    if args.keep:
        out["logs"] = str(root)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
