"""``echo-node status``: the running node writes what it knows to a file in its
data dir every few seconds (atomically); the command reads it.

A file rather than a port: nothing listens for it, and a node that died
leaves no answer to confuse (the file is removed on a clean exit, and a
status whose process is gone is reported as such).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio
from libp2p.peer.id import ID

from protocol.net.dial import current_route
from protocol.net.host import full_addrs
from protocol.process.files import write_atomic
from protocol.process.runtime import task_count

if TYPE_CHECKING:
    from echo_node.backend import Backend
    from protocol.broadcast.engine import BroadcastEngine
    from protocol.net.reachability import Reachability
    from protocol.net.swarm import Swarm


class Node(Protocol):
    """What the status file shows of a node (``echo_node.node.Node``, which
    keeps the file written: it imports this module, never the other way)."""

    me: str
    job_id: str
    learner: ID | None
    version: int
    backend: Backend | None
    tokens_per_s: float
    reachability: Reachability
    swarm: Swarm | None
    engine: BroadcastEngine | None
    rollouts_sent: int
    receipts_accepted: int


EVERY_S = 2.0


def snapshot(node: Node) -> dict[str, Any]:
    return {
        "peer": node.me,
        "pid": os.getpid(),
        "updated_unix": round(time.time(), 1),
        "job_id": node.job_id,
        "learner": node.learner.to_base58() if node.learner else "",
        "version": node.version,
        "backend": node.backend.name if node.backend else "",
        "dtype": node.backend.dtype if node.backend else "",
        "device": node.backend.device.name if node.backend else "",
        "tokens_per_s": round(node.tokens_per_s, 1),
        "reachability": node.reachability.to_json(),
        "relay_reservations": node.swarm.relay.to_json() if node.swarm and node.swarm.relay else [],
        "upnp": node.swarm.upnp.to_json() if node.swarm and node.swarm.upnp else {"state": "off"},
        "addrs": full_addrs(node.swarm.host) if node.swarm else [],
        "neighbours": _neighbours(node),
        "chunks_from": dict(node.engine.stats.chunks_from) if node.engine else {},
        "rollouts_sent": node.rollouts_sent,
        "batches_accepted": node.receipts_accepted,
        "tasks": task_count(),
    }


def _neighbours(node: Node) -> dict[str, str]:
    """Each broadcast neighbour and how we reach it (direct or relayed)."""
    if node.engine is None or node.swarm is None:
        return {}
    host = node.swarm.host
    return {peer: current_route(host, ID.from_base58(peer)) or "connecting" for peer in node.engine.neighbours}


async def keep_written(node: Node, path: Path) -> None:
    """Rewrite ``path`` whenever the node's status changes, until cancelled;
    then remove it."""
    last = None
    try:
        while True:
            now = snapshot(node)
            news = json.dumps({**now, "updated_unix": 0}, sort_keys=True)
            if news != last:  # the clock alone is no news
                write_atomic(path, json.dumps(now, indent=2))
                last = news
            await trio.sleep(EVERY_S)
    finally:
        path.unlink(missing_ok=True)


class NotRunning(LookupError):
    pass


def read(path: Path) -> dict[str, Any]:
    """The status a running node wrote; ``NotRunning`` if there is none."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise NotRunning(f"no node is running with this data dir ({path} is absent)") from None
    except (OSError, ValueError) as exc:
        raise NotRunning(f"cannot read {path}: {exc}") from None
    try:
        os.kill(int(data["pid"]), 0)
    except (ProcessLookupError, KeyError, ValueError, TypeError):
        raise NotRunning(f"the node that wrote {path} is no longer running") from None
    except PermissionError:
        pass  # alive, under another user
    return data


def running(path: Path) -> dict[str, Any] | None:
    """The status of a node running with this status file, or None (``read``)."""
    try:
        return read(path)
    except NotRunning:
        return None


def describe(data: dict[str, Any]) -> str:
    reach = data["reachability"]
    status = {
        "public": "public: other peers can dial this node",
        "private": "behind NAT or a firewall: this node dials out, nobody can dial it",
        "unknown": "unknown: no peer has answered a dial-back request yet",
    }[reach["status"]]
    answers = "".join(f"\n             {peer[-12:]}: {answer}" for peer, answer in reach["answers"].items())
    relays = "".join(
        f"\n             relay reservation on {r['relay'][-12:]} (renewed before {r['expires_in_s']} s)"
        for r in data["relay_reservations"]
    )
    return (
        f"node       {data['peer']}\n"
        f"job        {data['job_id'] or '-'} (learner {data['learner'] or 'not found yet'})\n"
        f"weights    version {data['version']} ({data['backend']} {data['dtype']} on {data['device']}, "
        f"{data['tokens_per_s']:.0f} tokens/s)\n"
        f"reachable  {status}{answers}{relays}\n"
        f"upnp       {data['upnp']['state']}\n"
        f"swarm      {len(data['neighbours'])} neighbours "
        f"({sum(r.startswith('relayed') for r in data['neighbours'].values())} through a relay); "
        f"addresses {', '.join(data['addrs'])}\n"
        f"work       {data['rollouts_sent']} rollouts sent, {data['batches_accepted']} batches accepted"
    )
