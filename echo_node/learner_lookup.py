"""Finding the learner: through an invite's addresses, the DHT, or the LAN.

A learner names itself as a provider of the job directory key and keeps its
newest signed manifest under its manifest keys (``echo_learner.swarm.directory``).
A node reads that record to learn the job; the record's signature is checked
against the learner's peer id (``protocol.net.records``), and Noise proves who
answers at the address. A learner nobody named is taken only when its job is
the one job that checks out (``echo_node.jobs``): anyone can announce one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.peer.peerstore import PERMANENT_ADDR_TTL

from echo_node.config import NodeConfig
from echo_node.jobs import Job, JobCheck, check_model, describe_choice, list_jobs, log_skipped, read_job
from echo_node.refusals import DoesNotFit
from protocol.ids import JOB_DIRECTORY_KEY
from protocol.messages import Manifest
from protocol.net.host import parse_multiaddr
from protocol.net.swarm import Swarm, find_providers
from protocol.process.logs import event

log = logging.getLogger(__name__)


class NoLearnerFound(LookupError):
    """No learner announced a job in the DHT within the discovery timeout."""


class SeveralJobs(NoLearnerFound):
    """No learner was named and more than one valid job is listed: the
    volunteer chooses (``--job-id``, ``--learner``)."""


@dataclass(frozen=True)
class FoundLearner:
    peer: ID
    record: Manifest  # its signed manifest record, as found in the DHT
    addrs: tuple[multiaddr.Multiaddr, ...]  # where it answered


def pin_learner(host: IHost, learner: ID, addrs: Sequence[multiaddr.Multiaddr]) -> None:
    """Make ``addrs`` the learner's addresses in the peerstore, for good, and
    allow a redial at once.

    py-libp2p forgets a peer's addresses 2 minutes to 2 hours after whoever
    added them last (a connect: 2 minutes), and refuses to redial a peer for
    60 s after a failed dial. A node whose connection to the learner dropped
    later (a NAT forgot it, a second connection under one peer id made
    py-libp2p close it) could then not redial until the DHT told it again
    where the learner is: 1-5 failed requests, up to ~30 s of lost work.
    """
    if not addrs:
        return
    host.get_network().unblock_peer(learner)
    host.get_peerstore().add_addrs(learner, list(addrs), PERMANENT_ADDR_TTL)


async def find_learner(
    swarm: Swarm, config: NodeConfig, learner_addrs: tuple[str, ...] = (), check: JobCheck = check_model
) -> FoundLearner:
    """Look up a learner and read its job from its manifest record.

    A learner the volunteer named (``config.learner``, as an invite does) is
    taken as its signed record says: its operator chose it, and a model that
    does not fit is refused later with the reason. Otherwise the DHT's job
    directory is read and a job is taken only when exactly one checks out
    (``check``, of ``config.job_id`` if set): anyone can announce a job, so a
    job that fails is skipped and logged, and ``SeveralJobs`` asks the
    volunteer to choose among valid ones. ``NoLearnerFound`` if none answers
    in time. ``learner_addrs``: where an invite says it listens, tried first."""
    wanted = config.learner
    if wanted and learner_addrs:
        # An invite said where the learner listens: no DHT walk needed.
        addrs = [parse_multiaddr(a) for a in learner_addrs]
        found = await _try_learner(swarm, config, PeerInfo(ID.from_base58(wanted), addrs))
        if found is not None:
            return found
    # With no bootstrap peer only the LAN can answer, and soon if at all.
    patience = config.discovery_timeout_s if config.bootstrap else config.lan_wait_s
    skipped: set[tuple[str, str]] = set()
    misfit = ""  # why the last sound job this machine cannot hold was skipped
    with trio.move_on_after(patience):
        while True:
            if wanted:
                providers = await find_providers(swarm, JOB_DIRECTORY_KEY, config.request_timeout_s)
                if wanted in providers:
                    found = await _try_learner(swarm, config, providers[wanted])
                    if found is not None:
                        return found
            else:
                jobs = await list_jobs(swarm, config.request_timeout_s, check)
                log_skipped(jobs, skipped)
                misfit = next((j.problem for j in jobs if not j.fits), misfit)
                valid = [j for j in jobs if j.ok and (not config.job_id or _job_of(j) == config.job_id)]
                if len(valid) > 1:
                    raise SeveralJobs(
                        f"{len(valid)} jobs are listed in the DHT; choose one (echo-node jobs lists them):\n"
                        + describe_choice(valid)
                    )
                if valid:
                    job = valid[0]
                    assert job.record is not None
                    pin_learner(swarm.host, ID.from_base58(job.learner), job.addrs)
                    return FoundLearner(ID.from_base58(job.learner), job.record, job.addrs)
            await trio.sleep(config.retry_s)
    if not config.bootstrap:
        raise NoLearnerFound(
            f"no learner answered on the local network (mDNS) within {patience:.0f} s and no "
            "bootstrap peer was given: paste the invite the learner's operator gave you "
            "(echo-node join echo1:...), or pass --bootstrap ADDR"
        )
    if misfit:
        # Only now: a job too big for this machine may be a decoy's, and
        # another job that fits may still be announced.
        raise DoesNotFit(misfit)
    rejected = (
        f"; skipped {len({peer for peer, _ in skipped})} that failed their checks (see the log)" if skipped else ""
    )
    raise NoLearnerFound(
        f"no learner{' ' + wanted if wanted else ''} found in the DHT within {patience:.0f} s{rejected}"
    )


def _job_of(job: Job) -> str:
    return job.record.job_id if job.record is not None else ""


async def relocate_learner(
    swarm: Swarm, learner: ID, known: Sequence[multiaddr.Multiaddr], request_timeout_s: float
) -> tuple[multiaddr.Multiaddr, ...]:
    """Look the learner up again in the DHT: a learner restarted on another
    port or machine announces its new addresses there. Only the learner's
    own peer id is followed. Its addresses now (``known`` if the DHT has
    none), pinned in the peerstore (``pin_learner``)."""
    found = await find_providers(swarm, JOB_DIRECTORY_KEY, request_timeout_s)
    info = found.get(learner.to_base58())
    addrs = tuple(known)
    if info is not None and info.addrs:
        if known and not set(map(str, info.addrs)) & set(map(str, known)):
            event(log, logging.WARNING, "the learner moved; trying its new address", addrs=[str(a) for a in info.addrs])
            swarm.host.get_peerstore().clear_addrs(learner)
        addrs = tuple(info.addrs)
    pin_learner(swarm.host, learner, addrs)
    return addrs


async def _try_learner(swarm: Swarm, config: NodeConfig, info: PeerInfo) -> FoundLearner | None:
    """The named learner's job, if its signed record is found (and is of
    ``config.job_id`` when set); its model is checked when it is followed."""
    job = await read_job(swarm, info, config.request_timeout_s, check=lambda record: None)
    if job.record is None:
        event(log, logging.INFO, "skipping learner", peer=info.peer_id, error=job.problem)
        return None
    if config.job_id and job.record.job_id != config.job_id:
        event(log, logging.INFO, "skipping learner of another job", peer=info.peer_id, job=job.record.job_id)
        return None
    pin_learner(swarm.host, info.peer_id, info.addrs)
    return FoundLearner(info.peer_id, job.record, tuple(info.addrs))
