"""A day of churn, compressed: ``--nodes`` volunteers come and go for ``--minutes``.

Real processes on loopback, started with the commands a user types: two
bootstrap peers (relays), a learner training LoRA adapters on the built-in
model (async mode, a version every step: a few seconds apart) and
``--nodes`` nodes, each generating at an emulated speed (``--emulate-tokens-
per-s`` drawn from ``SPEEDS``) with llama.cpp. While it runs:

- every ``--churn-s`` a random node is killed with SIGKILL and another joins:
  half the time a fresh identity, half the time one of the killed nodes
  coming back with its data dir;
- the learner is killed with SIGKILL and resumed from its checkpoint twice
  (at ``LEARNER_KILLS`` of the run), the second time on another address
  (127.0.0.2): nodes must find it again through the DHT;
- one bootstrap peer is restarted (SIGINT, then the same identity and port).

Every ``--sample-s`` it reads each long-lived process's RSS and open file
descriptors (/proc), and the learner's ``/api/status`` (version, peers,
trio tasks). At the end it reads every live node's ``status.json``, stops
everything (nodes first) and compares the learner's ledger with the receipts
every node data dir holds.

Figures (``--json``: one line):

- ``nodes``, ``minutes``, ``identities`` (distinct node identities that ran),
  ``kills`` (node SIGKILLs), ``learner_restarts``;
- ``lost_accepted``: receipts a node holds that say accepted, without an
  accepted row in the ledger; ``duplicated``: ledger rows beyond one per
  batch hash plus receipts a node holds twice; ``ledger_rows``,
  ``receipts_held`` and ``ledger_not_held`` (rows whose receipt no node
  holds: a node killed between the learner's verdict and its own write);
- ``learner_rss_growth``, ``bootstrap_rss_growth`` (the larger of the two)
  and ``fd_growth`` (the largest over long-lived processes: learner,
  bootstraps, nodes alive from the growth window's start to the end): the
  median of the last minute over the median of the minute from
  ``GROWTH_FROM`` of the run (minute 5 of 20), less 1;
  ``learner_tasks_growth`` likewise for its trio tasks; ``non_socket_fd_growth``
  the same for descriptors other than sockets (sockets follow the live peers
  a process is connected to), and ``fd_worst_per_minute`` the descriptors
  and sockets of the process with the largest ``fd_growth``, minute by minute;
- ``max_step_gap_s`` and ``step_gaps`` (gaps between training steps longer
  than ``--gap-report-s``, each with the learner restart it spans, if any);
- ``live_nodes_behind_at_end``: live nodes that did not reach the learner's
  newest version at the end, less 2, within ``CATCH_UP_S`` (a version takes
  the broadcast seconds to reach everyone; a node left behind never gets
  there), and ``live_nodes_behind_at_the_instant`` (the same at the moment
  the newest was read); ``node_disk_over_quota``: data dirs over ``--max-disk-gb``;
- ``spurious_learner_losses``: "lost the learner" in a node's log outside
  the windows where the learner was down (its kill until ``RECOVERY_S``
  after it serves again); ``undelivered_outside_restarts`` likewise for
  "batch not delivered";
- ``work_refusals``: the learner refusing a node work (a ban), anywhere;
- ``learner_peers_tracked`` (peers in the learner's table at the end),
  ``learner_stream_failures`` (streams it timed out or saw break, by protocol).

    python bench/soak.py --json                          # 32 nodes, 20 minutes
    python bench/soak.py --nodes 6 --minutes 4 --churn-s 20   # a quick look

Everything is bounded in time and stopped by PID; ``--keep-logs DIR`` keeps
the processes' logs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import ledger_verdicts, node_receipts, print_result  # noqa: E402
from swarmproc import free_port, keep_logs  # noqa: E402

SPEEDS = (20.0, 50.0, 200.0)  # emulated tokens/s: a laptop, a desktop, a GPU
LEARNER_KILLS = (0.10, 0.175)  # fractions of the run; the second moves the learner
BOOTSTRAP_RESTART = 0.2
GROWTH_FROM = 0.25  # growth is measured from here (minute 5 of 20) to the end
RECOVERY_S = 90.0  # after a restarted learner serves, nodes may still be finding it
CATCH_UP_S = 30.0  # for the live nodes to reach the learner's newest version at the end, less 2
START_TIMEOUT_S = 180.0
STOP_GRACE_S = 30.0


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    started: float  # time.monotonic()
    data_dir: Path | None = None
    samples: list[tuple[float, int, int, int]] = field(default_factory=list)  # (t, rss KiB, fds, sockets)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def sample(self, t: float) -> None:
        try:
            status = Path(f"/proc/{self.popen.pid}/status").read_text()
            fd_dir = Path(f"/proc/{self.popen.pid}/fd")
            targets = []
            for fd in fd_dir.iterdir():
                try:
                    targets.append(os.readlink(fd))
                except OSError:  # closed while we looked
                    pass
        except OSError:  # exited between the check and the read
            return
        rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        sockets = sum(target.startswith("socket:") for target in targets)
        self.samples.append((t, rss, len(targets), sockets))


def growth(samples: list[tuple[float, float]], since: float, end: float) -> float | None:
    """Median of the last minute over the median of the minute from ``since``, less 1."""
    first = [v for t, v in samples if since <= t < since + 60]
    last = [v for t, v in samples if t >= end - 60]
    if not first or not last or statistics.median(first) == 0:
        return None
    return round(statistics.median(last) / statistics.median(first) - 1, 4)


class Soak:
    def __init__(self, root: Path, args: argparse.Namespace):
        self.root, self.args = root, args
        self.rng = random.Random(args.seed)
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.bootstraps: list[Proc] = []
        self.bootstrap_addrs: list[str] = []
        self.learner: Proc | None = None
        self.learner_url = ""
        self.learner_samples: list[tuple[float, dict]] = []  # (t, /api/status)
        self.nodes: dict[str, Proc] = {}  # live ones by name
        self.dead_dirs: list[Path] = []  # killed nodes' data dirs, to come back
        self.all_dirs: list[Path] = []
        self.retired: list[Proc] = []  # every process that ended, for their samples
        self.down: list[list[float]] = []  # [killed, serving again] of the learner (wall clock)
        self.kills = 0
        self.next_node = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def spawn(self, name: str, args: list[str], data_dir: Path | None = None, **kw) -> Proc:
        log = open(self.root / f"{name}.log", "a")
        popen = subprocess.Popen(
            [sys.executable, "-m", *args],
            stdout=kw.pop("stdout", log),
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # stopped by PID; Ctrl-C here does not reach it
        )
        log.close()
        return Proc(name, popen, time.monotonic(), data_dir)

    # --- the processes ---------------------------------------------------------------

    def start_bootstrap(self, i: int, port: int) -> str:
        others = [a for a in self.bootstrap_addrs[:i] if a]
        args = ["bootstrap", "--listen", f"/ip4/127.0.0.1/tcp/{port}", "--identity", str(self.root / f"boot{i}.key")]
        for other in others:
            args += ["--bootstrap", other]
        proc = self.spawn(f"bootstrap{i}", args, stdout=subprocess.PIPE)
        assert proc.popen.stdout is not None
        ready, _, _ = select.select([proc.popen.stdout], [], [], START_TIMEOUT_S)
        line = proc.popen.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("/ip4/"):
            raise RuntimeError(f"bootstrap{i} printed {line!r}; see bootstrap{i}.log")
        if i < len(self.bootstraps):
            self.retired.append(self.bootstraps[i])
            self.bootstraps[i] = proc
        else:
            self.bootstraps.append(proc)
            self.bootstrap_addrs.append(line)
        return line

    def start_learner(self, ip: str, resume: bool) -> None:
        data_dir = self.root / "learner"
        (data_dir / "api.json").unlink(missing_ok=True)  # a killed learner leaves its own
        args = ["echo_learner", "run", "--listen", f"/ip4/{ip}/tcp/0", "--data-dir", str(data_dir)]
        for addr in self.bootstrap_addrs:
            args += ["--bootstrap", addr]
        args += ["--mode", "async", "--publish-every", "1", "--steps", "1000000", "--checkpoint-every", "5"]
        args += ["--lora", "8", "--lr", "3e-3", "--no-mdns", "-v"]  # -v: its stream failures
        if resume:
            args.append("--resume")
        self.learner = self.spawn("learner", args, data_dir)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (data_dir / "api.json").exists():
            if not self.learner.alive or time.monotonic() > deadline:
                raise RuntimeError("the learner did not start; see learner.log")
            time.sleep(0.5)  # polling a file another process writes
        self.learner_url = json.loads((data_dir / "api.json").read_text())["url"].split("#", 1)[0]

    def start_node(self, data_dir: Path | None = None) -> None:
        if data_dir is None:
            data_dir = self.root / f"node{self.next_node}"
            self.all_dirs.append(data_dir)
        name = f"node{self.next_node}"
        self.next_node += 1
        args = ["echo_node", "join", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(data_dir)]
        for addr in self.bootstrap_addrs:
            args += ["--bootstrap", addr]
        args += ["--name", name, "--emulate-tokens-per-s", str(self.rng.choice(SPEEDS))]
        args += ["--max-disk-gb", str(self.args.max_disk_gb), "--reachability-every-s", "60", "--no-mdns"]
        self.nodes[name] = self.spawn(name, args, data_dir)

    def churn(self) -> None:
        """Kill a random node (SIGKILL); a fresh one or a killed one coming back joins."""
        name = self.rng.choice(sorted(self.nodes))
        victim = self.nodes.pop(name)
        victim.popen.kill()
        victim.popen.wait()
        self.retired.append(victim)
        self.kills += 1
        assert victim.data_dir is not None
        self.dead_dirs.append(victim.data_dir)
        if self.rng.random() < 0.5 and len(self.dead_dirs) > 1:
            back = self.dead_dirs.pop(self.rng.randrange(len(self.dead_dirs) - 1))  # not the one just killed
            self.start_node(back)
        else:
            self.start_node()

    def kill_learner(self, move: bool) -> None:
        assert self.learner is not None
        self.down.append([time.time(), float("inf")])
        self.learner.popen.kill()
        self.learner.popen.wait()
        self.retired.append(self.learner)
        self.start_learner("127.0.0.2" if move else "127.0.0.1", resume=True)
        self.down[-1][1] = time.time()

    def restart_bootstrap(self, i: int) -> None:
        proc = self.bootstraps[i]
        proc.popen.send_signal(signal.SIGINT)
        proc.popen.wait(STOP_GRACE_S)
        port = int(self.bootstrap_addrs[i].split("/tcp/")[1].split("/")[0])
        self.start_bootstrap(i, port)

    # --- measuring -------------------------------------------------------------------

    def sample(self) -> None:
        t = self.now()
        for proc in [*self.bootstraps, *self.nodes.values(), *([self.learner] if self.learner else [])]:
            if proc.alive:
                proc.sample(t)
        try:
            with urllib.request.urlopen(self.learner_url + "api/status", timeout=10) as reply:
                self.learner_samples.append((t, json.load(reply)))
        except OSError:
            pass  # restarting, or too busy to answer: the gap shows in the samples

    def learner_api(self, path: str) -> dict:
        with urllib.request.urlopen(self.learner_url + path, timeout=30) as reply:
            return json.load(reply)

    def run(self) -> dict:
        args = self.args
        duration = args.minutes * 60
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            self.start_bootstrap(i, port)
        self.start_learner("127.0.0.1", resume=False)
        for _ in range(args.nodes):
            self.start_node()
            time.sleep(args.start_gap_s)  # staggered, as volunteers arrive; not a synchronisation
        self.t0 = time.monotonic()  # the run's clock starts with every node started
        events = [(f * duration, "learner", i == 1) for i, f in enumerate(LEARNER_KILLS)]
        events.append((BOOTSTRAP_RESTART * duration, "bootstrap", False))
        events.sort()
        next_churn, next_sample = args.churn_s, 0.0
        while (t := self.now()) < duration:
            if self.learner is not None and not self.learner.alive:
                raise RuntimeError("the learner exited by itself; see learner.log")
            if events and t >= events[0][0]:
                at, what, move = events.pop(0)
                if what == "bootstrap":
                    self.restart_bootstrap(1)
                elif (self.root / "learner" / "checkpoint.pt").exists():
                    self.kill_learner(move)
                else:  # nothing to resume from yet: a little later
                    events.insert(0, (at + 5, what, move))
            if t >= next_churn:
                self.churn()
                next_churn += args.churn_s
            if t >= next_sample:
                self.sample()
                next_sample += args.sample_s
            time.sleep(0.5)  # the scheduler's tick
        return self.finish(duration)

    def finish(self, duration: float) -> dict:
        args = self.args
        newest = self.learner_api("api/status")["version"]
        peers_tracked = len(self.learner_api("api/peers")["peers"])
        behind_now = self.behind(newest)
        # A version takes the broadcast a few seconds to reach every node: a
        # node that keeps up reaches the newest at the end within CATCH_UP_S,
        # one left behind does not.
        deadline = time.monotonic() + CATCH_UP_S
        behind = behind_now
        while behind and time.monotonic() < deadline:
            time.sleep(1)  # polling files the nodes rewrite every 2 s
            behind = self.behind(newest)
        self.stop_all()
        since = GROWTH_FROM * duration
        long_lived = [p for p in [*self.bootstraps, *self.nodes.values()] if p.samples and p.samples[0][0] <= since]
        assert self.learner is not None
        fd = {
            p.name: growth([(t, f) for t, _, f, _ in p.samples], since, duration) for p in [self.learner, *long_lived]
        }
        # Sockets follow the live peers a process is connected to; anything
        # else (files, pipes, epoll) growing is a leak whatever the swarm does.
        other_fd = {
            p.name: growth([(t, f - s) for t, _, f, s in p.samples], since, duration)
            for p in [self.learner, *long_lived]
        }
        boot_rss = [growth([(t, r) for t, r, _, _ in p.samples], since, duration) for p in self.bootstraps]
        tasks = [(t, s["load"]["tasks"]) for t, s in self.learner_samples if "tasks" in s.get("load", {})]
        ledger = self.compare_ledger()
        gaps = self.step_gaps()
        losses, undelivered, denied = self.node_troubles()
        known_fd = {k: v for k, v in fd.items() if v is not None}
        return {
            "nodes": args.nodes,
            "minutes": round(duration / 60, 1),
            "identities": len(self.all_dirs),
            "kills": self.kills,
            "learner_restarts": len(self.down),
            **ledger,
            "learner_rss_growth": growth([(t, r) for t, r, _, _ in self.learner.samples], since, duration),
            "bootstrap_rss_growth": max((g for g in boot_rss if g is not None), default=None),
            "fd_growth": max(known_fd.values(), default=None),
            "fd_growth_worst": max(known_fd, key=known_fd.__getitem__) if known_fd else None,
            "fd_worst_per_minute": self.per_minute(max(known_fd, key=known_fd.__getitem__)) if known_fd else [],
            "non_socket_fd_growth": max((g for g in other_fd.values() if g is not None), default=None),
            "learner_fd_growth": fd[self.learner.name],
            "learner_tasks_growth": growth(tasks, since, duration),
            "learner_tasks_end": tasks[-1][1] if tasks else None,
            "learner_rss_mib_end": round(self.learner.samples[-1][1] / 1024, 1) if self.learner.samples else None,
            "long_lived_processes": len(long_lived) + 1,
            "max_step_gap_s": max((g["gap_s"] for g in gaps["all"]), default=None),
            "step_gaps": gaps["long"],
            "steps": gaps["steps"],
            "newest_version": newest,
            "live_nodes_behind_at_end": len(behind),
            "behind": behind,
            "live_nodes_behind_at_the_instant": len(behind_now),
            "node_disk_over_quota": self.over_quota(),
            "spurious_learner_losses": len(losses),
            "spurious_detail": losses[:10],
            "undelivered_outside_restarts": len(undelivered),
            "undelivered_detail": undelivered[:5],
            "work_refusals": len(denied),
            "work_refusal_detail": denied[:5],
            "learner_peers_tracked": peers_tracked,
            "learner_stream_failures": self.stream_failures(),
        }

    def per_minute(self, name: str) -> list[list[int]]:
        """``name``'s descriptors and sockets, the last sample of each minute."""
        proc = next(
            p
            for p in [*self.bootstraps, *self.nodes.values(), *([self.learner] if self.learner else [])]
            if p.name == name
        )
        last: dict[int, list[int]] = {}
        for t, _, fds, sockets in proc.samples:
            last[int(t // 60)] = [fds, sockets]
        return [last[m] for m in sorted(last)]

    def behind(self, newest: int) -> list[dict]:
        """Live nodes more than 2 versions behind ``newest``, by their status.json."""
        out = []
        for name, proc in self.nodes.items():
            assert proc.data_dir is not None
            try:
                version = json.loads((proc.data_dir / "status.json").read_text())["version"]
            except (OSError, ValueError, KeyError):
                version = -1
            if version < newest - 2:
                out.append({"node": name, "version": version})
        return out

    def stop_all(self) -> None:
        """Nodes first (SIGINT: a clean leave), then the learner and the bootstraps."""
        order = [*self.nodes.values(), *([self.learner] if self.learner else []), *self.bootstraps]
        for proc in order:
            if proc.alive:
                proc.popen.send_signal(signal.SIGINT)
        for proc in order:
            try:
                proc.popen.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()

    def kill_all(self) -> None:
        for proc in [*self.nodes.values(), *self.bootstraps, *self.retired, *([self.learner] if self.learner else [])]:
            if proc.alive:
                proc.popen.kill()
                proc.popen.wait()

    def compare_ledger(self) -> dict:
        """The learner's ledger against the receipts every node data dir holds."""
        rows = ledger_verdicts(self.root / "learner" / "ledger.sqlite")
        ledger = dict(rows)
        held: dict[str, str] = {}
        held_twice = 0
        for data_dir in self.all_dirs:
            seen: set[str] = set()
            for receipt in node_receipts(data_dir):
                held_twice += receipt["batch_hash"] in seen
                seen.add(receipt["batch_hash"])
                held[receipt["batch_hash"]] = receipt["verdict"]
        lost = [h for h, v in held.items() if v == "accepted" and ledger.get(h) != "accepted"]
        return {
            "lost_accepted": len(lost),
            "duplicated": len(rows) - len(ledger) + held_twice,
            "ledger_rows": len(rows),
            "ledger_accepted": sum(v == "accepted" for v in ledger.values()),
            "receipts_held": len(held),
            "ledger_not_held": sum(h not in held for h in ledger),
        }

    def step_gaps(self) -> dict:
        """Gaps between training steps (metrics.jsonl), the long ones with the restart they span."""
        path = self.root / "learner" / "metrics.jsonl"
        times = sorted(json.loads(line)["time"] for line in path.read_text().splitlines() if line.strip())
        gaps = [{"at_s": round(a - self.wall0, 1), "gap_s": round(b - a, 1)} for a, b in zip(times, times[1:])]
        long = []
        for gap in gaps:
            if gap["gap_s"] > self.args.gap_report_s:
                start = self.wall0 + gap["at_s"]
                spans = [i for i, (killed, _) in enumerate(self.down) if start <= killed <= start + gap["gap_s"]]
                long.append({**gap, "learner_restart": spans[0] + 1 if spans else None})
        return {"all": gaps, "long": long, "steps": len(times)}

    def node_troubles(self) -> tuple[list[str], list[str], list[str]]:
        """Lines of node logs saying the learner was lost, or a batch not delivered,
        outside the windows where the learner was down; and every refusal of
        work (a ban) by the learner."""

        def expected(stamp: float) -> bool:
            return any(killed <= stamp <= back + RECOVERY_S for killed, back in self.down)

        losses, undelivered, denied = [], [], []
        day = datetime.fromtimestamp(self.wall0).date()
        for log in sorted(self.root.glob("node*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if "refuses this node work" in line:
                    denied.append(f"{log.stem}: {line[:300]}")
                lost, missed = "lost the learner" in line, "batch not delivered" in line
                if not (lost or missed):
                    continue
                try:
                    clock = datetime.strptime(line[:12], "%H:%M:%S.%f").time()
                except ValueError:
                    continue
                if expected(datetime.combine(day, clock).timestamp()):
                    continue
                (losses if lost else undelivered).append(f"{log.stem}: {line[:300]}")
        return losses, undelivered, denied

    def stream_failures(self) -> dict[str, int]:
        """Streams the learner gave up on, by protocol and what happened (its -v log)."""
        counts: dict[str, int] = {}
        for line in (self.root / "learner.log").read_text(errors="replace").splitlines():
            for what in ("refused stream", "stream timed out", "stream broke"):
                if what in line and "protocol=" in line:
                    key = f"{line.split('protocol=')[1].split()[0]} {what}"
                    counts[key] = counts.get(key, 0) + 1
        return counts

    def over_quota(self) -> int:
        quota = self.args.max_disk_gb * 2**30
        return sum(du(d) > quota for d in self.all_dirs if d.exists())


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=32, help="nodes alive at any time")
    parser.add_argument("--minutes", type=float, default=20.0, help="length of the run, once every node started")
    parser.add_argument("--churn-s", type=float, default=30.0, help="a node is killed and one joins this often")
    parser.add_argument("--sample-s", type=float, default=10.0, help="RSS, descriptors and learner status this often")
    parser.add_argument("--start-gap-s", type=float, default=2.0, help="between the first nodes' starts")
    parser.add_argument("--max-disk-gb", type=float, default=0.05, help="each node's disk quota (--max-disk-gb)")
    parser.add_argument("--gap-report-s", type=float, default=30.0, help="list step gaps longer than this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy process logs here")
    args = parser.parse_args()
    if args.nodes < 2 or args.minutes <= 0:
        parser.error("--nodes must be at least 2 and --minutes positive")
    root = Path(tempfile.mkdtemp(prefix="echo-soak-"))
    soak = Soak(root, args)

    # The whole run is bounded: setup, the run, and stopping.
    def overran(*_: object) -> None:
        raise TimeoutError("the soak ran past its bound")

    signal.signal(signal.SIGALRM, overran)
    signal.alarm(int(args.minutes * 60 + args.nodes * args.start_gap_s + 4 * START_TIMEOUT_S + 600))
    try:
        result = soak.run()
    finally:
        signal.alarm(0)
        soak.kill_all()
        keep_logs(root, args.keep_logs)
        shutil.rmtree(root, ignore_errors=True)
    print_result(result, args.json)


if __name__ == "__main__":
    main()
