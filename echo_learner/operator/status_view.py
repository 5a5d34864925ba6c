"""``echo-learner status`` and ``echo-learner peers``: what the running
learner's API says (``api_client``), as a table or as JSON."""

from __future__ import annotations

import argparse
import json

from echo_learner.operator import api_client


def command(args: argparse.Namespace, prog: str) -> None:
    """``status`` or ``peers``, as ``args.command`` says."""
    if args.command == "status":
        data = api_client.get(args.url, args.data_dir, "/api/status", prog=prog)
        if args.json:
            print(json.dumps(data, indent=2))
        else:
            print_status(data)
        return
    peers = api_client.get(args.url, args.data_dir, "/api/peers", prog=prog)["peers"]
    if args.json:
        print(json.dumps(peers, indent=2))
    else:
        print_peers(peers)


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


def print_status(data: dict) -> None:
    """``/api/status`` as one line per field."""
    cap = data["capacity"]
    m = data["measurements"]
    reward = "-" if data["reward"] is None else f"{data['reward']:.3f}"
    held = data["heldout"]
    if held:
        lo, hi = held["ci95"]
        reward += f"; held-out accuracy {held['accuracy']:.3f} (95% CI {lo:.3f}-{hi:.3f}) at version {held['version']}"
    from protocol.process.tables import print_fields

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


PEER_COLUMNS = (
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
NUMERIC_PEER_COLUMNS = ("free GiB", "tokens/s", "version", "rollouts/s", "accepted", "refused", "seen")


def peer_row(p: dict) -> list[object]:
    """One peer of ``/api/peers`` under ``PEER_COLUMNS``."""
    banned = f" BANNED {p['banned_for_s']:.0f}s" if p["banned_for_s"] else ""
    caught = f" CAUGHT ({p['caught']})" if p.get("caught") else ""
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
        p["last_reason"] + banned + caught,
    ]


def print_peers(peers: list[dict]) -> None:
    """``/api/peers`` as a table, a row per peer."""
    from protocol.process.tables import print_table

    print_table(PEER_COLUMNS, (peer_row(p) for p in peers), numeric=NUMERIC_PEER_COLUMNS)
