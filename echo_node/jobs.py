"""The DHT's job directory as a node sees it: who announces a job, and whether
each announcement checks out.

Anyone can name itself a provider of the job directory key and put a validly
self-signed manifest under its own manifest key: a signature only proves
who wrote a record, not that the job is real. So each job is read and checked
the way the node would use it (its record's signature against the provider's
peer id, then its model config through the node's own ``echo_node.guard``),
and a job that fails is reported with the reason, never taken
(``echo_node.learner_lookup``). ``echo-node jobs`` prints this list.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.network.exceptions import SwarmException
from libp2p.peer.peerinfo import PeerInfo

from echo_node.config import NodeConfig
from echo_node.model_shape import model_shape
from echo_node.refusals import DoesNotFit, Refused
from protocol.ids import JOB_DIRECTORY_KEY, manifest_keys, swarm_keys
from protocol.messages import Manifest
from protocol.net.records import InvalidRecord, decode_record
from protocol.net.swarm import Swarm, find_providers, providers_of
from protocol.process.logs import event

log = logging.getLogger(__name__)

# What a node asks of a job's manifest before taking it; raises ``Refused``.
JobCheck = Callable[[Manifest], None]


def check_model(record: Manifest) -> None:
    """Refuse a job whose model config the node could not build: not JSON, a
    family we do not run, or sizes missing or out of bounds (``model_shape``)."""
    model_shape(record.model_config)


@dataclass(frozen=True)
class Job:
    """One announcement in the job directory, as read and checked."""

    learner: str  # the provider's peer id: whoever must have signed the record
    addrs: tuple[multiaddr.Multiaddr, ...]  # where the DHT says it listens
    record: Manifest | None  # its manifest record, when one was found and its signature holds
    problem: str = ""  # why it is not a job to take ("" when it checks out)
    fits: bool = True  # False: a sound job whose model this machine cannot hold (``problem`` says why)
    nodes: int | None = None  # peers other than the learner announced under the job's swarm key (None: not asked)

    @property
    def ok(self) -> bool:
        return not self.problem

    @property
    def model(self) -> str:
        """The model's family and size, as far as its config says."""
        if self.record is None:
            return "?"
        try:
            kind = str(json.loads(self.record.model_config).get("model_type", "?"))
        except (ValueError, AttributeError):
            return "?"
        try:
            return f"{kind} {model_shape(self.record.model_config).parameters / 1e6:,.1f}M"
        except Refused:
            return kind

    def as_json(self) -> dict:
        r = self.record
        return {
            "job_id": r.job_id if r else None,
            "task": r.task if r else None,
            "model": self.model,
            "version": r.version if r else None,
            "learner": self.learner,
            "nodes": self.nodes,
            "ok": self.ok,
            "problem": self.problem,
        }


async def read_job(swarm: Swarm, info: PeerInfo, timeout_s: float, check: JobCheck = check_model) -> Job:
    """Read and check ``info``'s manifest record: the hashed key first, then the
    legacy one (``protocol.ids.manifest_keys``). Never raises for a bad job:
    its ``problem`` says what is wrong."""
    learner = info.peer_id.to_base58()
    addrs = tuple(info.addrs)
    try:
        with trio.fail_after(timeout_s):
            if info.addrs:
                await swarm.host.connect(info)
            for key in manifest_keys(learner):
                value = await swarm.dht.get_value(key)
                if value is not None:
                    break
    except (trio.TooSlowError, OSError, SwarmException) as exc:
        return Job(learner, addrs, None, f"unreachable: {exc or type(exc).__name__}")
    if value is None:
        return Job(learner, addrs, None, "no manifest record in the DHT")
    try:
        record = decode_record(key, value)
    except InvalidRecord as exc:
        return Job(learner, addrs, None, str(exc))
    try:
        check(record)
    except Refused as exc:
        return Job(learner, addrs, record, str(exc), fits=not isinstance(exc, DoesNotFit))
    return Job(learner, addrs, record)


async def list_jobs(
    swarm: Swarm, timeout_s: float, check: JobCheck = check_model, *, count_nodes: bool = False
) -> list[Job]:
    """Every job the directory lists now, each read and checked at once.

    As many as the DHT returns: py-libp2p keeps at most 20 providers per key
    on a peer, and ``find_providers`` asks at most 8 peers. ``count_nodes``:
    also ask how many peers announce themselves under each signed job's swarm
    key (the learner aside; claims nobody verified)."""
    providers = await find_providers(swarm, JOB_DIRECTORY_KEY, timeout_s)
    jobs: dict[str, Job] = {}

    async def read(info: PeerInfo) -> None:
        job = await read_job(swarm, info, timeout_s, check)
        if count_nodes and job.record is not None:
            announced = await providers_of(swarm, swarm_keys(job.record.job_id), timeout_s)
            job = dataclasses.replace(job, nodes=len(set(announced) - {job.learner}))
        jobs[job.learner] = job

    async with trio.open_nursery() as nursery:
        for info in providers.values():
            nursery.start_soon(read, info)
    return [jobs[peer] for peer in providers if peer in jobs]


def log_skipped(jobs: list[Job], told: set[tuple[str, str]]) -> None:
    """Log each job that failed its checks, once per learner and reason
    (``told`` remembers), so a decoy costs one line, not one per retry."""
    for job in jobs:
        if not job.ok and (job.learner, job.problem) not in told:
            told.add((job.learner, job.problem))
            event(
                log,
                logging.WARNING,
                "skipping a job that fails its checks",
                learner=job.learner,
                job=job.record.job_id if job.record else None,
                reason=job.problem,
            )


def describe_choice(jobs: list[Job]) -> str:
    """One line per valid job, for the "choose one" message."""
    return "\n".join(
        f"  --job-id {j.record.job_id} --learner {j.learner}  ({j.record.task}, {j.model})"
        for j in jobs
        if j.record is not None
    )


def print_jobs(jobs: list[Job]) -> None:
    from protocol.process.tables import print_table

    def row(j: Job) -> tuple:
        r = j.record
        nodes = "?" if j.nodes is None else j.nodes
        return (r.job_id if r else "?", r.task if r else "?", j.model, j.learner, nodes, "ok" if j.ok else j.problem)

    print_table(["job", "task", "model", "learner", "nodes", "checks"], (row(j) for j in jobs), numeric=["nodes"])


async def look(config: NodeConfig, patience_s: float) -> list[Job]:
    """Join the swarm under a throwaway identity (a node running with this
    data dir keeps its own peer id and port) and list the job directory;
    while it lists none, look again every ``retry_s`` for up to ``patience_s``."""
    from protocol.identity import Identity
    from protocol.net.host import any_port
    from protocol.net.lan import discover_lan
    from protocol.net.swarm import connect_bootstrap, open_swarm

    listen = [any_port(addr) for addr in config.listen]
    async with open_swarm(Identity.generate(), listen, server=True) as swarm, trio.open_nursery() as nursery:
        if config.mdns:
            await nursery.start(discover_lan, swarm, config.bootstrap_timeout_s)
        await connect_bootstrap(swarm, config.bootstrap, config.bootstrap_timeout_s)
        jobs = await list_jobs(swarm, config.request_timeout_s, count_nodes=True)
        with trio.move_on_after(patience_s):
            while not jobs:
                await trio.sleep(config.retry_s)
                jobs = await list_jobs(swarm, config.request_timeout_s, count_nodes=True)
        nursery.cancel_scope.cancel()
    return jobs
