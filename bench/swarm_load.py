"""One learner under a crowd of volunteers: where it saturates and what it costs per batch.

For each level N (default 10, 100, 300, 1000) a fresh swarm of real
processes on loopback: a bootstrap peer, a learner (``echo-learner run``,
the built-in tiny model on the reverse task, async mode, training and
verifying on ``--learner-device``) pinned to the first CPU (the first
``--learner-cpus``), and a few emulator processes (bench/load_identities.py)
pinned with everything else to the rest. Each emulator runs one real node that follows
the learner's versions and shares its weights with its N/processes light
identities: real libp2p peers with their own keys, each asking for work,
generating real rollouts, signing and submitting them, checking receipts and
keeping a have-stream, at the pace of its class (``Load.laptop_share`` of
laptops taking 10-30 s per assignment, GPU nodes 2-5 s). Identities start at
``--ramp-per-s``; after ``--settle-s`` the measurement window opens for
``--duration-s``; then the identities deliver what they hold, fetch their
receipts and stop, and the learner is stopped.

Measured per level, over the window:

- ``identities``: hosts with a live connection to the learner, the least at
  any second of the window (the emulators count them every second), and
  ``identities_stuck``: those left holding only closed connections;
- ``accepted_batches_per_s``, ``verified_tokens_per_s``: accepted verdicts
  and their completion tokens in the learner's ledger, by ``created_ms``;
- ``learner_cpu_s`` (utime + stime, /proc), ``learner_rss_gib`` (VmRSS at
  the window's end) and ``verified_tokens_per_learner_cpu_s``;
- ``work_request_p99_ms``: client-side latency of work requests answered
  with an assignment (the long poll's wait for prompts included) or an
  error; long polls that ended in ``NoWork`` are counted apart
  (``no_work_polls``), as a node waits them out by design;
- ``submit_p99_ms`` (a batch to its receipt), ``status_api_p99_ms``
  (``/api/status`` polled ``Load.status_polls_per_s`` times a second);
- ``lost_accepted``: receipts that said accepted and are missing from the
  receipts the identity fetches back at the end, plus those without an
  accepted row in the ledger (``lost_detail`` has both);
- refusals by reason (receipts), errors by kind (work, rollout, have), the
  emulators' share of their CPU and their event loops' lateness (near 1.0
  and hundreds of ms: the emulator, not the learner, is the limit and
  inflates the latencies), and the learner's own CPU split per accepted
  batch when its status has one (``load``: since it started;
  ``load_window``: over the window);
- ``control_ms_per_batch``: the learner's CPU per accepted batch over the
  window in every phase but recompute and training (streams, admission,
  signatures, receipts, ledger, publishing, the event loop), and
  ``emulator_limited``: the emulators' loops ran more than 100 ms late at
  p99, so the figures are a lower bound of what the learner could take.

Across levels: ``control_growth``, ``control_ms_per_batch`` at the largest N
over that at N = 100, and ``rss_growth_per_identity_kib`` between the smallest and
largest N. ``--compare-verify`` runs one level twice, with ``--verify-batch
1`` and with the learner's default (or ``--verify-batch``), and reports
``batched_over_single``, the ratio of their verified tokens per learner
CPU-second. ``--compare-streams`` runs one level twice, the emulated
nodes opening a new stream for each work request and batch (the protocols'
older versions) and then keeping their streams, and reports
``control_kept_over_each``, the ratio of their ``control_ms_per_batch``.
``--offered R`` has every identity rest between assignments so that the
crowd offers R batches a second in all (``offered_per_s`` in each level;
without it, the classes' own paces offer what that key says), to measure a
level below its saturation. ``--py-spy`` samples the learner during each window (py-spy
must be installed) and adds its hottest frames.

    python bench/swarm_load.py --quick              # N = 10, 100: ~3 minutes
    python bench/swarm_load.py --json               # N = 10, 100, 300, 1000: ~20 minutes
    python bench/swarm_load.py --levels 300 --compare-verify --json
    python bench/swarm_load.py --levels 300 --compare-streams --json
    python bench/swarm_load.py --levels 300,1000 --learner-device cuda --learner-cpus 2 --json   # a GPU machine
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from harness import accepted_in, pinned, read_ledger  # noqa: E402
from localswarm import SwarmError, local_swarm  # noqa: E402
from observe import control_ms, load_split  # noqa: E402

IDENTITIES = Path(__file__).resolve().parent / "load_identities.py"
DEFAULT_LEVELS = (10, 100, 300, 1000)
PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))  # in the venv's bin
LEARNER_START_S = 180.0  # model, first version, DHT announce
JOIN_S = 120.0  # an emulator's node joins and loads the first version
FINISH_S = 180.0  # the identities deliver, fetch their receipts and report
STOP_GRACE_S = 60.0
EMULATOR_LAG_LIMIT_MS = 100.0


@dataclass(frozen=True)
class Job:
    """The learner's settings: small batches, so that it verifies many of them."""

    # One prompt of group 4 per batch, answers of at most 4 tokens (the reverse
    # task's 3 letters + eos): the per-batch costs (streams, signature, ledger,
    # receipt) weigh most, as with many small volunteers.
    group_size: int = 4
    prompts_per_request: int = 1
    max_new_tokens: int = 4
    # Async mode, a pool of 64 x 32 = 2,048 prompts: every one of 1,000
    # identities can hold one while trained groups wait.
    prompts_per_step: int = 64
    buffer_steps: int = 32
    # A version lives 8 x 8 steps in the window: at ~1 step/s a laptop's 30 s
    # assignment still comes back inside it.
    staleness: int = 8
    publish_every: int = 8
    assignment_timeout_s: float = 60.0  # a laptop's 30 s plus a learner slowed by the load
    verify_batch: int | None = None  # None: the learner's default
    device: str = "cpu"  # where it trains and verifies (--learner-device)

    def learner_args(self, identities: int) -> list[str]:
        args = [
            "--mode", "async",
            "--staleness", str(self.staleness),
            "--publish-every", str(self.publish_every),
            "--buffer-steps", str(self.buffer_steps),
            "--group-size", str(self.group_size),
            "--prompts-per-step", str(self.prompts_per_step),
            "--prompts-per-request", str(self.prompts_per_request),
            "--max-new-tokens", str(self.max_new_tokens),
            "--assignment-timeout-s", str(self.assignment_timeout_s),
            "--steps", "1000000",
            "--eval-every", "0",  # held-out scoring would take the learner's core
            "--device", self.device,
            "--max-connections", str(max_connections(identities)),
        ]  # fmt: skip
        if self.verify_batch is not None:
            args += ["--verify-batch", str(self.verify_batch)]
        return args


def max_connections(identities: int) -> int:
    """Room for every identity, the emulators' nodes and the bootstrap peer
    below py-libp2p's trimming watermark (15/16 of the cap). (``protocol.net.host``
    sizes py-libp2p's resource manager to it: left at its defaults, it closed
    every inbound connection beyond 256 right after the handshake.)"""
    return max(1024, 2 * identities + 256)


@dataclass(frozen=True)
class Load:
    """The emulated crowd and the measurement."""

    processes: int = 4  # emulator processes, each with one node holding the weights
    ramp_per_s: float = 50.0  # identities started per second, over all processes
    settle_s: float = 30.0  # after the last identity started, before the window
    duration_s: float = 120.0  # the measurement window
    laptop_share: float = 0.7
    laptop_s: tuple[float, float] = (10.0, 30.0)  # emulated seconds per assignment
    gpu_s: tuple[float, float] = (2.0, 5.0)
    receipts_every_s: float = 120.0  # each identity fetches its receipts this often
    status_polls_per_s: float = 4.0
    one_stream_each: bool = False  # a new stream per work request and batch (the older protocol versions)
    offered_per_s: float = 0.0  # batches a second the whole crowd offers (0: each class at its own pace)

    def rest_s(self, identities: int) -> float:
        """Seconds each identity rests after an assignment, before asking for
        the next, so that ``identities`` offer ``offered_per_s`` batches a
        second in all (0 without ``offered_per_s``, or when their own paces
        offer less). Resting, not generating slower: an assignment still comes
        back well inside its deadline and the version window."""
        if not self.offered_per_s or identities * self.rate_per_identity(0.0) <= self.offered_per_s:
            return 0.0
        lo, hi = 0.0, 1e5
        for _ in range(100):  # bisection: the rate falls as the rest grows
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if identities * self.rate_per_identity(mid) > self.offered_per_s else (lo, mid)
        return hi

    def rate_per_identity(self, rest_s: float) -> float:
        """Batches a second one identity offers: the mean of 1 / (pace + rest)
        for a pace drawn evenly from its class's range (an assignment is one batch)."""

        def rate(lo: float, hi: float) -> float:
            lo, hi = lo + rest_s, hi + rest_s
            return math.log(hi / lo) / (hi - lo) if hi > lo else 1 / lo

        return self.laptop_share * rate(*self.laptop_s) + (1 - self.laptop_share) * rate(*self.gpu_s)


# --- processes ---------------------------------------------------------------------


class Emulator:
    """A bench/load_identities.py process, read through its JSON lines."""

    def __init__(self, name: str, args: list[str], log_dir: Path, cpus: set[int]):
        self.name = name
        self.log = open(log_dir / f"{name}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(IDENTITIES), *args],
            stdout=subprocess.PIPE,
            stderr=self.log,
            start_new_session=True,  # its own process group: stopped as one, never by Ctrl-C's group
            preexec_fn=pinned(cpus),
        )
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._buf = b""
        self.latest: dict[str, dict] = {}  # event kind -> its latest line

    def read(self) -> None:
        """Take in whatever lines it has printed."""
        assert self.proc.stdout is not None
        while True:
            try:
                data = os.read(self.proc.stdout.fileno(), 1 << 20)
            except BlockingIOError:
                return
            if not data:
                return
            self._buf += data
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                if line.strip():
                    event = json.loads(line)
                    self.latest[event["event"]] = event

    def wait_for(self, kind: str, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while kind not in self.latest:
            self.read()
            if self.proc.poll() is not None and kind not in self.latest:
                raise SwarmError(f"{self.name} exited {self.proc.returncode}; see {self.log.name}")
            if time.monotonic() > deadline:
                raise SwarmError(f"{self.name}: no {kind!r} in {timeout_s:.0f} s; see {self.log.name}")
            time.sleep(0.2)  # polling its pipe
        return self.latest[kind]

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        """SIGTERM to its group, SIGKILL if it is not gone in 10 s."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.log.close()


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (/proc/<pid>/stat), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_gib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    raise SwarmError(f"no VmRSS for {pid}")


def get_status(url: str, timeout_s: float = 10.0) -> tuple[dict, float]:
    """``/api/status`` and how long it took to answer (ms)."""
    started = time.perf_counter()
    with urllib.request.urlopen(url + "api/status", timeout=timeout_s) as reply:
        status = json.load(reply)
    return status, (time.perf_counter() - started) * 1000


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)], 1)


def learner_supports(flag: str) -> bool:
    """Whether this tree's ``echo-learner run`` takes ``flag``."""
    out = subprocess.run(
        [sys.executable, "-m", "echo_learner", "run", "--help"], capture_output=True, text=True, timeout=60
    )
    return flag in out.stdout


class PySpy:
    """``py-spy record`` on the learner for one window, its hottest frames after."""

    def __init__(self, pid: int, seconds: float, out: Path, *, gil: bool = False):
        self.out = out
        self.proc = subprocess.Popen(
            [
                PY_SPY, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                "--rate", "50", "--format", "raw", "--nonblocking", "--output", str(out),
                *(["--gil"] if gil else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip

    def top(self, frames: int = 15) -> dict:
        """Where the learner's busy samples were: by the function they were in
        (self) and by the functions on their stack (inclusive, entry frames
        left out), as shares of the samples not waiting in epoll or in an idle
        worker thread."""
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            _, err = self.proc.communicate()
        if not self.out.exists():
            return {"error": err.decode(errors="replace")[-500:]}
        leaf: Counter[str] = Counter()
        inclusive: Counter[str] = Counter()
        total = idle = 0
        for line in self.out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack:
                continue
            n = int(count)
            names = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
            total += n
            if names[-1].split(" ")[0] in IDLE_FRAMES:
                idle += n
                continue
            leaf[names[-1]] += n
            for name in set(names):
                if not name.split("(")[-1].startswith(ENTRY_PATHS):
                    inclusive[name] += n
        busy = max(total - idle, 1)
        share = lambda c, k: {f: round(v / busy, 3) for f, v in c.most_common(k)}  # noqa: E731
        return {
            "samples": total,
            "idle_share": round(idle / max(total, 1), 3),
            "self": share(leaf, frames),
            "inclusive": share(inclusive, 2 * frames),
        }


# Where a sampled thread waits rather than works: trio's epoll wait, and a
# worker thread parked in trio's thread cache.
IDLE_FRAMES = ("EpollIOManager.get_events", "WorkerThread._work")
# Frames on (nearly) every stack: they say nothing about where time goes.
ENTRY_PATHS = (
    "threading.py", "<frozen", "trio/", "outcome/", "contextlib.py", "torch/utils/_contextlib.py",
    "protocol/process/runtime.py", "echo_learner/cli.py", "echo_learner/__main__.py",
)  # fmt: skip


# --- one level ---------------------------------------------------------------------


def run_level(identities: int, job: Job, load: Load, root: Path, cpus: tuple[set[int], set[int]], py_spy: str) -> dict:
    """One fresh swarm under ``identities`` volunteers; the figures of its window."""
    learner_cpus, other_cpus = cpus
    processes = min(load.processes, identities)
    with local_swarm(root) as swarm, ExitStack() as emulators:
        swarm.cpus = {"learner": learner_cpus, "bootstrap": other_cpus}
        bootstrap = swarm.start_bootstrap()
        learner = swarm.start_learner(*job.learner_args(identities))
        url, status = wait_for_learner(root / "learner", learner)
        address = next(a for a in status["addrs"] if a.startswith("/ip4/127.0.0.1/"))
        rss_start = rss_gib(learner.pid)

        crowd: list[Emulator] = []
        rest_s = load.rest_s(identities)
        for p in range(processes):
            count = identities // processes + (p < identities % processes)
            first = sum(identities // processes + (q < identities % processes) for q in range(p))
            args = [
                "--bootstrap", bootstrap, "--learner", address, "--job-id", status["job_id"],
                "--count", str(count), "--first", str(first), "--ramp-per-s", str(load.ramp_per_s / processes),
                "--laptop-share", str(load.laptop_share), "--laptop-s", ",".join(map(str, load.laptop_s)),
                "--gpu-s", ",".join(map(str, load.gpu_s)), "--receipts-every-s", str(load.receipts_every_s),
                "--rest-s", f"{rest_s:.3f}",
                "--seed", str(p), "--data-dir", str(root / f"emulator{p}"),
            ] + (["--one-stream-each"] if load.one_stream_each else [])  # fmt: skip
            emulator = Emulator(f"emulator{p}", args, root, other_cpus)
            emulators.callback(emulator.stop)
            crowd.append(emulator)
        for emulator in crowd:
            emulator.wait_for("joined", JOIN_S)
        for emulator in crowd:
            emulator.wait_for("ramped", identities / load.ramp_per_s + JOIN_S)
        watch(crowd, learner, load.settle_s)

        # The window.
        spy = PySpy(learner.pid, load.duration_s, root / "py-spy.txt", gil=py_spy == "gil") if py_spy else None
        before, _ = get_status(url)
        t0, cpu0 = time.time(), cpu_s(learner.pid)
        for emulator in crowd:
            emulator.signal(signal.SIGUSR1)
        seen = watch(crowd, learner, load.duration_s, url=url, polls_per_s=load.status_polls_per_s)
        for emulator in crowd:
            emulator.signal(signal.SIGUSR2)
        t1, cpu1, rss = time.time(), cpu_s(learner.pid), rss_gib(learner.pid)
        after, _ = get_status(url)
        results = [emulator.wait_for("result", FINISH_S) for emulator in crowd]
        codes = {"learner": swarm.stop("learner", grace_s=STOP_GRACE_S)}
    ledger = window_ledger(root / "learner" / "ledger.sqlite", t0, t1, results)
    elapsed, learner_cpu = t1 - t0, cpu1 - cpu0
    window = sum((Counter(r["window"]) for r in results), Counter())
    latencies = {k: [x for r in results for x in r["latencies_ms"][k]] for k in results[0]["latencies_ms"]}
    emulator_cpu = sum(r["cpu_s"] for r in results)
    result = {
        "identities_target": identities,
        "offered_per_s": round(identities * load.rate_per_identity(load.rest_s(identities)), 2),
        "identities": min(seen["connected"], default=0),
        "identities_max": max(seen["connected"], default=0),
        # Identities whose only connections to the learner are closed ones
        # py-libp2p still lists (the learner dropped them): they never dial again.
        "identities_stuck": max(seen["stuck"], default=0),
        "emulator_processes": processes,
        "window_s": round(elapsed, 1),
        "accepted_batches_per_s": round(ledger["accepted"] / elapsed, 2),
        "verified_tokens_per_s": round(ledger["tokens"] / elapsed, 1),
        "learner_cpu_s": round(learner_cpu, 2),
        "learner_cpu_share": round(learner_cpu / elapsed, 3),
        "verified_tokens_per_learner_cpu_s": round(ledger["tokens"] / learner_cpu, 1) if learner_cpu else None,
        "learner_rss_gib": round(rss, 3),
        "learner_rss_start_gib": round(rss_start, 3),  # serving, before the first identity
        "work_request_p50_ms": percentile(latencies["work"], 50),
        "work_request_p99_ms": percentile(latencies["work"], 99),
        "work_requests_answered": len(latencies["work"]),
        "no_work_polls": len(latencies["no_work"]),
        "submit_p50_ms": percentile(latencies["submit"], 50),
        "submit_p99_ms": percentile(latencies["submit"], 99),
        "receipts_fetch_p99_ms": percentile(latencies["receipts"], 99),
        "status_api_p50_ms": percentile(seen["status_ms"], 50),
        "status_api_p99_ms": percentile(seen["status_ms"], 99),
        "status_api_failures": seen["status_failures"],
        "lost_accepted": ledger["missing"] + run_total(results, "accepted_missing_from_fetch"),
        "lost_detail": {
            "missing_from_ledger": ledger["missing"],
            "missing_from_fetch": run_total(results, "accepted_missing_from_fetch"),
            "final_fetch_failed": run_total(results, "final_receipts_failed"),
            "receipts_checked": ledger["checked"],
        },
        "refusals": {k.split(":", 1)[1]: v for k, v in sorted(window.items()) if k.startswith("refused:")},
        "errors": {k: v for k, v in sorted(window.items()) if is_error(k)},
        "have": {k: run_total(results, k) for k in ("have_sent", "have_refused", "have_ended", "have_open_failed")},
        # Work and rollout streams in the window: opened (a
        # negotiation each) or an exchange on a kept one.
        "streams": {k: window[f"streams_{k}"] for k in ("opened", "reused")},
        "emulator_cpu_share": round(emulator_cpu / elapsed, 3),
        "emulator_loop_lag_p99_ms": percentile(latencies["loop_lag"], 99),
        # Their cyclic collector's passes in the window, summed over the
        # processes by generation, and the longest: a pass stops a loop.
        "emulator_gc_ms": dict(sum((Counter(r["gc_ms"]) for r in results), Counter())),
        "emulator_gc_max_ms": max(r["gc_max_ms"] for r in results),
        "steps_in_window": after["step"] - before["step"],
        "version": after["version"],
        "learner_refusals_total": after.get("refusals", {}),
        "exit_codes": codes,
    }
    # The emulators, not the learner, are the limit when their loops run late.
    result["emulator_limited"] = (result["emulator_loop_lag_p99_ms"] or 0) > EMULATOR_LAG_LIMIT_MS
    if "load" in after:
        result["load"] = after["load"]  # since the learner started
        result["load_window"] = load_split(before["load"], after["load"])
        # The learner's own collector in the window (its longest pass: since it started).
        gc_before, gc_after = Counter(before["load"].get("gc_ms", {})), Counter(after["load"].get("gc_ms", {}))
        result["learner_gc_ms"] = {g: round(gc_after[g] - gc_before[g], 1) for g in gc_after}
        result["learner_gc_max_ms"] = after["load"].get("gc_max_ms")
        result["control_ms_per_batch"] = control_ms(result["load_window"])
    if spy is not None:
        result["py_spy"] = spy.top()
    return result


def wait_for_learner(data_dir: Path, learner: subprocess.Popen) -> tuple[str, dict]:
    """The status API's URL once the learner has published and announced its job."""
    deadline = time.monotonic() + LEARNER_START_S
    while True:
        if learner.poll() is not None:
            raise SwarmError(f"learner exited {learner.returncode}; see {data_dir.parent}/learner.log")
        if time.monotonic() > deadline:
            raise SwarmError(f"learner not serving in {LEARNER_START_S:.0f} s; see {data_dir.parent}/learner.log")
        api = data_dir / "api.json"
        if api.exists():
            url = json.loads(api.read_text())["url"].split("#", 1)[0]
            status, _ = get_status(url)
            if status["addrs"]:
                return url, status
        time.sleep(0.5)  # polling the learner's start


def watch(
    crowd: list[Emulator], learner: subprocess.Popen, seconds: float, *, url: str = "", polls_per_s: float = 0
) -> dict:
    """Read the emulators' lines (and poll the status API, given ``url``) for ``seconds``.

    Returns the identities connected (and stuck) at each second, summed
    over emulators, and each status poll's time to answer."""
    seen: dict = {"connected": [], "stuck": [], "status_ms": [], "status_failures": 0}
    deadline, next_poll, next_count = time.monotonic() + seconds, 0.0, time.monotonic() + 1
    while (now := time.monotonic()) < deadline:
        if learner.poll() is not None:
            raise SwarmError(f"learner exited {learner.returncode} under load")
        for emulator in crowd:
            emulator.read()
            if emulator.proc.poll() is not None:
                raise SwarmError(f"{emulator.name} exited {emulator.proc.returncode}; see {emulator.log.name}")
        if now >= next_count:
            for key in ("connected", "stuck"):
                seen[key].append(sum(e.latest["stats"][key] for e in crowd if "stats" in e.latest))
            next_count += 1
        if url and now >= next_poll:
            try:
                _, ms = get_status(url)
                seen["status_ms"].append(ms)
            except OSError:  # a timeout or a refused connection: the API did not answer
                seen["status_failures"] += 1
            next_poll = now + 1 / polls_per_s
        time.sleep(0.05)  # pacing the loop between polls
    return seen


def window_ledger(path: Path, t0: float, t1: float, results: list[dict]) -> dict:
    """Accepted verdicts and their tokens in the window, and how many of the
    receipts the identities hold as accepted have no accepted row."""
    in_window = accepted_in(path, int(t0 * 1000), int(t1 * 1000)).values()
    accepted, tokens = sum(b for b, _ in in_window), sum(n for _, n in in_window)
    rows = {
        (p, bytes(h)) for p, h in read_ledger(path, "SELECT peer, batch_hash FROM verdicts WHERE verdict = 'accepted'")
    }
    held = {(peer, bytes.fromhex(h)) for r in results for peer, hashes in r["accepted"].items() for h in hashes}
    return {"accepted": accepted, "tokens": tokens, "missing": len(held - rows), "checked": len(held)}


def run_total(results: list[dict], key: str) -> int:
    """``key`` counted over the whole run (the end's checks come after the window)."""
    return sum(r["total"].get(key, 0) for r in results)


def is_error(key: str) -> bool:
    return key.split(":", 1)[0] in (
        "work_error", "rollout_error", "work_failed", "submit_failed", "connect_failed",
        "dropped_assignment", "receipts_failed", "connection_lost",
    )  # fmt: skip


# --- the curve -----------------------------------------------------------------------


def run_levels(levels: list[int], job: Job, load: Load, base: Path, cpus, py_spy: str, tag: str = "") -> list[dict]:  # type: ignore[no-untyped-def]
    out = []
    for n in levels:
        root = base / f"n{n}{tag}"
        shutil.rmtree(root, ignore_errors=True)
        print(f"swarm_load: N={n}{tag} (logs in {root})", file=sys.stderr, flush=True)
        out.append(run_level(n, job, load, root, cpus, py_spy))
    return out


def control_growth(levels: list[dict]) -> float | None:
    """``control_ms_per_batch`` at the largest level over that at 100 identities
    (or the smallest level): 1.0 is a per-batch cost that does not grow with the swarm."""
    measured = [r for r in levels if r.get("control_ms_per_batch")]
    if len(measured) < 2:
        return None
    base = next(
        (r for r in measured if r["identities_target"] == 100), min(measured, key=lambda r: r["identities_target"])
    )
    large = max(measured, key=lambda r: r["identities_target"])
    return round(large["control_ms_per_batch"] / base["control_ms_per_batch"], 3) if large is not base else None


def rss_growth_kib(levels: list[dict]) -> float | None:
    if len(levels) < 2:
        return None
    small, large = min(levels, key=lambda r: r["identities"]), max(levels, key=lambda r: r["identities"])
    if large["identities"] == small["identities"]:
        return None
    return round(
        (large["learner_rss_gib"] - small["learner_rss_gib"]) * 2**20 / (large["identities"] - small["identities"]), 1
    )


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    if "error" in result.get("compare_verify", {}):
        print(result["compare_verify"]["error"])
        return
    levels = result.get("levels") or [result["compare_verify"][k] for k in ("single", "batched")]
    table = Table(title="swarm_load")
    table.add_column("figure")
    for r in levels:
        table.add_column(f"N={r['identities_target']}" + (f" vb={r['verify_batch']}" if "verify_batch" in r else ""))
    for key in (
        "identities", "accepted_batches_per_s", "verified_tokens_per_s", "learner_cpu_share",
        "verified_tokens_per_learner_cpu_s", "learner_rss_gib", "work_request_p99_ms", "submit_p99_ms",
        "status_api_p99_ms", "lost_accepted", "control_ms_per_batch", "emulator_cpu_share",
        "emulator_loop_lag_p99_ms", "emulator_limited", "refusals", "errors",
    ):  # fmt: skip
        table.add_row(key, *(str(r.get(key)) for r in levels))
    Console().print(table)
    for key, value in result.items():
        if key not in ("levels", "compare_verify"):
            print(f"{key}: {value}")
    if "compare_verify" in result:
        print(f"batched_over_single: {result['compare_verify']['batched_over_single']}")
    if "compare_streams" in result:
        print(f"control_kept_over_each: {result['compare_streams']['control_kept_over_each']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default=",".join(map(str, DEFAULT_LEVELS)), help="identities per level (N)")
    parser.add_argument("--quick", action="store_true", help="N = 10, 100 with short windows: a smoke run")
    parser.add_argument("--duration-s", type=float, default=None, help=f"window per level ({Load.duration_s})")
    parser.add_argument("--settle-s", type=float, default=None, help=f"after the ramp ({Load.settle_s})")
    parser.add_argument("--ramp-per-s", type=float, default=Load.ramp_per_s, help="identities started per second")
    parser.add_argument("--processes", type=int, default=Load.processes, help="emulator processes")
    parser.add_argument("--verify-batch", type=int, default=None, help="passed to the learner (default: its own)")
    parser.add_argument(
        "--learner-device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the learner trains and verifies (its --device; default: cpu)",
    )
    parser.add_argument(
        "--learner-cpus",
        type=int,
        default=1,
        help="CPUs pinned to the learner, the first ones; the emulators get the rest (default: 1)",
    )
    parser.add_argument(
        "--compare-verify",
        action="store_true",
        help="one level (the first of --levels, else 300) with --verify-batch 1 and with the default",
    )
    parser.add_argument(
        "--offered",
        type=float,
        default=0.0,
        help="batches a second the whole crowd offers, each identity resting between assignments to match "
        "(e.g. 0.7 of a level's measured saturation); default: each class at its own pace",
    )
    parser.add_argument(
        "--compare-streams",
        action="store_true",
        help="one level (the first of --levels, else 300) with a new stream per exchange and with kept streams",
    )
    parser.add_argument(
        "--py-spy",
        nargs="?",
        const="all",
        default="",
        choices=("all", "gil"),
        help="sample the learner with py-spy in each window; 'gil': only the thread holding the GIL "
        "(where its Python CPU goes: other threads' waits for the GIL are not counted)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="keep logs here (default: a temp dir, removed)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop every process we started

    levels = [int(x) for x in args.levels.split(",")]
    if args.offered < 0:
        parser.error("--offered must be at least 0")
    load = Load(processes=args.processes, ramp_per_s=args.ramp_per_s, offered_per_s=args.offered)
    if args.quick:
        levels = [10, 100] if args.levels == parser.get_default("levels") else levels
        load = replace(load, settle_s=10.0, duration_s=40.0)
    load = replace(
        load,
        duration_s=args.duration_s if args.duration_s is not None else load.duration_s,
        settle_s=args.settle_s if args.settle_s is not None else load.settle_s,
    )
    job = Job(verify_batch=args.verify_batch, device=args.learner_device)
    if args.verify_batch is not None and not learner_supports("--verify-batch"):
        parser.error("this learner has no --verify-batch")

    # The learner on the first --learner-cpus CPUs; the emulators, the
    # bootstrap peer and this process on the rest (the second, on a 2-core
    # machine; on a GPU machine, the learner's GPU and a few cores).
    all_cpus = sorted(os.sched_getaffinity(0))
    if not 1 <= args.learner_cpus < len(all_cpus):
        parser.error(
            f"--learner-cpus {args.learner_cpus}: the learner needs one CPU and the emulators one, of {len(all_cpus)}"
        )
    cpus = (set(all_cpus[: args.learner_cpus]), set(all_cpus[args.learner_cpus :]))
    os.sched_setaffinity(0, cpus[1])

    base = args.dir or Path(tempfile.mkdtemp(prefix="echo-swarm-load-"))
    result: dict = {
        "job": asdict(job),
        "load": asdict(load),
        "cpus": {"learner": sorted(cpus[0]), "emulators": sorted(cpus[1])},
    }
    try:
        if args.compare_verify:
            if not learner_supports("--verify-batch"):
                result["compare_verify"] = {"error": "this learner has no --verify-batch: nothing to compare"}
            else:
                n = levels[0] if args.levels != parser.get_default("levels") else 300
                (single,) = run_levels([n], replace(job, verify_batch=1), load, base, cpus, args.py_spy, "-vb1")
                (batched,) = run_levels([n], job, load, base, cpus, args.py_spy, "-vbdefault")
                single["verify_batch"], batched["verify_batch"] = 1, args.verify_batch or "default"
                a, b = single["verified_tokens_per_learner_cpu_s"], batched["verified_tokens_per_learner_cpu_s"]
                result["compare_verify"] = {
                    "single": single,
                    "batched": batched,
                    "batched_over_single": round(b / a, 2) if a and b else None,
                }
        elif args.compare_streams:
            n = levels[0] if args.levels != parser.get_default("levels") else 300
            (each,) = run_levels([n], job, replace(load, one_stream_each=True), base, cpus, args.py_spy, "-each")
            (kept,) = run_levels([n], job, load, base, cpus, args.py_spy, "-kept")
            a, b = each["control_ms_per_batch"], kept["control_ms_per_batch"]
            result["compare_streams"] = {
                "one_stream_each": each,
                "kept": kept,
                "control_kept_over_each": round(b / a, 3) if a and b else None,
            }
        else:
            result["levels"] = run_levels(levels, job, load, base, cpus, args.py_spy)
            result["rss_growth_per_identity_kib"] = rss_growth_kib(result["levels"])
            result["control_growth"] = control_growth(result["levels"])
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # every process it started was stopped on the way out
        sys.exit("swarm_load: interrupted")
