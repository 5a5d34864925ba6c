"""``echo-node doctor``: can this machine do useful work for the swarm, and if not, why?

Each check gives ``ok``, ``warn`` (works, but worse than it could) or ``fail``
(the node cannot do useful work), the finding in plain words and, unless it
is ok, what to do about it. In order:

  backends    llama.cpp / torch installed, GPU offload or CUDA available
  gpu         on a GPU: the chosen backend loads and decodes a tiny model there
              (in a child process, so that a crash is a finding)
  node        whether a node is running with this data dir (then left alone)
  bootstrap   each bootstrap peer answers a ping
  job         the job's record is in the DHT and its learner signature is valid
  learner     the learner answers, and how we reach it (direct or relayed)
  reachable   whether other peers can dial us (AutoNAT dial-backs)
  upnp        whether the home router forwards our port (UPnP-IGD)
  relay       behind NAT: a relay reservation on a bootstrap peer is granted
  hole punch  a TCP hole punch against a public peer (protocol.net.probe)
  memory      RAM the job's model needs against RAM available
  disk        disk its versions need against free disk in --data-dir
  upload      a two-second upload estimate to a bootstrap peer

The doctor writes nothing and never speaks as the node: it uses a throwaway
identity (its DHT presence, relay reservation and probes would otherwise
stand for the node's). Beside a running node it also listens on a port of
its own, and says so: the node's reachability is then in ``echo-node status``.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from echo_node import status
from echo_node.backend_choice import BackendUnavailable, choose, spec_of, specs
from echo_node.backend_trial import try_backend
from echo_node.config import NodeConfig
from echo_node.device import Device, cpu
from echo_node.memory import GiB, choose_dtype, free_bytes, gib, load_need
from echo_node.model_shape import model_shape
from echo_node.refusals import Refused
from protocol.identity import Identity
from protocol.messages import Manifest
from protocol.net.host import any_port, parse_peer_addr
from protocol.net.probe import measure_upload, try_punch
from protocol.net.reachability import PRIVATE, PUBLIC, Reachability, check_reachability
from protocol.net.swarm import Swarm, open_swarm, ping
from protocol.net.upnp import PortMapper
from protocol.rpc import route

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 1024:,.0f} KiB"


def check_backends(config: NodeConfig) -> Check:
    """What is installed, and where ``echo-node join`` would generate with these settings."""
    found = [spec.report() for spec in specs() if spec.installed()]
    if not found:
        return Check(
            "backends",
            FAIL,
            "no inference backend is installed",
            "pip install echo-swarm (torch) or 'echo-swarm[llama]' (llama.cpp)",
        )
    try:
        backend, why = choose(config.backend, config.dtype, config.threads, config.gguf_dir, config.device)
    except BackendUnavailable as exc:
        return Check("backends", FAIL, f"{', '.join(found)}; {exc}", "change --backend or --device")
    active = f"{', '.join(found)}; generating with {backend.name}: {why}"
    gpu_here = any(spec.gpu_kinds() for spec in specs() if spec.installed()) or _has_nvidia_gpu()
    if backend.device.gpu or not gpu_here:
        return Check("backends", OK, active)
    return Check(
        "backends",
        WARN,
        active + "; a GPU is present but unused",
        "install a GPU build (README, 'A gaming PC') or pass --device",
    )


def check_gpu(config: NodeConfig) -> Check | None:
    """The chosen GPU backend loads and decodes a tiny model, tried in a child
    process (``echo_node.backend_trial``: a crash is a finding); None on the CPU."""
    try:
        backend, _ = choose(config.backend, config.dtype, config.threads, config.gguf_dir, config.device)
    except BackendUnavailable:
        return None  # check_backends says why
    if not backend.device.gpu:
        return None
    trial = try_backend(backend.name, config.dtype, backend.device.kind)
    return Check("gpu", OK if trial.ok else FAIL, trial.detail, trial.instead and f"try {trial.instead}")


def _has_nvidia_gpu() -> bool:
    """An NVIDIA driver is loaded, whatever our backends were built with."""
    return Path("/proc/driver/nvidia/gpus").exists()


def check_memory(config: NodeConfig, model_config: str) -> Check:
    """The job's model against the memory free where the node would generate."""
    try:
        backend, _ = choose(config.backend, config.dtype, config.threads, config.gguf_dir, config.device)
        device: Device = backend.device
    except BackendUnavailable:
        backend, device = None, cpu()
    spec = backend.spec if backend else spec_of("torch")
    free = free_bytes(device, int(config.max_memory * GiB))
    try:
        shape = model_shape(model_config)
        dtype = choose_dtype(shape, spec, config.dtype, free)
    except Refused as exc:
        return Check(
            "memory",
            FAIL,
            str(exc),
            "close other programs, use --backend llama --dtype auto, or a machine with more memory",
        )
    need = load_need(shape, spec, dtype)
    return Check(
        "memory",
        OK,
        f"the model in {spec.name} {dtype} needs about {need.describe()} to load; {gib(free)} free on {device.name}",
    )


def check_upnp(mapper: PortMapper | None, public: bool, port: int | None) -> Check:
    if mapper is None:
        return Check("upnp", OK, "off (--no-upnp)")
    if mapper.mapped:
        ports = ", ".join(map(str, mapper.mapped))
        return Check(
            "upnp",
            OK,
            f"your router forwards TCP port {ports} to this machine "
            f"(UPnP; its WAN address is {mapper.external_ip or 'unknown'})",
        )
    if public:
        return Check("upnp", OK, f"not needed: other peers can dial this node ({mapper.state})")
    return Check(
        "upnp",
        WARN,
        mapper.state,
        "turn on UPnP in your router's settings, or forward "
        f"TCP port {port} to this machine by hand (and listen on a fixed port with --listen)",
    )


async def diagnose(config: NodeConfig, learner_addrs: tuple[str, ...], timeout_s: float) -> list[Check]:
    """Run every check; never raises for what it finds. Each check is a
    function of its own, in the order a volunteer fixes them: what a later
    one needs (a bootstrap peer that answers, the job's record) ends the
    run when it is missing."""
    checks = [check_backends(config)]
    gpu = check_gpu(config)
    if gpu is not None:
        checks.append(gpu)
    listen = config.listen
    running = _running_node(config)
    if running is not None:
        checks.append(running)
        listen = [any_port(addr) for addr in listen]  # the node holds its own
    identity = Identity.generate()
    async with open_swarm(identity, listen, server=True, relays=config.bootstrap, upnp=config.upnp) as swarm:
        answering = await check_bootstrap(swarm, config, checks)
        if not answering:
            checks.append(
                Check("job", FAIL, "not looked up: no bootstrap peer answered", "fix the bootstrap check first")
            )
            return checks
        found = await check_job(swarm, config, identity, learner_addrs, checks)
        if found is None:
            return checks
        learner, record = found
        host = swarm.host
        checks.append(await check_learner(host, learner, timeout_s))

        reach = await check_reachability(host, [info.peer_id for info in answering] + [learner], timeout_s)
        port = _listen_port(host)
        checks.append(reachable_check(reach, port))
        checks.append(check_upnp(swarm.upnp, reach.status == PUBLIC, port))
        checks.append(await check_relay(swarm, answering, reach.status == PRIVATE))
        if port:
            checks.append(await check_hole_punch(host, answering[0].peer_id, port, timeout_s))
        checks.append(check_memory(config, record.model_config))
        checks.append(check_disk(config, record.total_size))
        checks.append(await check_upload(host, answering[0].peer_id, timeout_s))
    return checks


async def check_bootstrap(swarm: Swarm, config: NodeConfig, checks: list[Check]) -> list[PeerInfo]:
    """One check per bootstrap peer (appended to ``checks``); those that answer."""
    answering = []
    for addr in config.bootstrap:
        info = parse_peer_addr(addr)
        try:
            rtt = await ping(swarm.host, info, config.bootstrap_timeout_s)
        except Exception as exc:  # any failure of dial or stream: it does not answer
            checks.append(
                Check(
                    "bootstrap",
                    FAIL,
                    f"{addr} does not answer ({type(exc).__name__}: {exc})"[:300],
                    "check the address (echo-bootstrap prints it) and that this machine "
                    "can reach it: a firewall may block outgoing TCP to its port",
                )
            )
            continue
        answering.append(info)
        await swarm.dht.add_peer(info.peer_id)
        checks.append(Check("bootstrap", OK, f"{addr} answers in {rtt * 1000:.1f} ms"))
    return answering


async def check_job(
    swarm: Swarm, config: NodeConfig, identity: Identity, learner_addrs: tuple[str, ...], checks: list[Check]
) -> tuple[ID, Manifest] | None:
    """The job's record, found as a node finds it (its check appended to
    ``checks``); the learner and the record, or None."""
    from echo_node.learner_lookup import NoLearnerFound
    from echo_node.node import Node

    node = Node(config, identity, learner_addrs=learner_addrs, swarm=swarm)
    try:
        await node.find_learner(keep_waiting=False)
    except NoLearnerFound as exc:
        checks.append(
            Check(
                "job",
                FAIL,
                str(exc),
                "check the invite (or --learner / --job-id); "
                "is the learner running and connected to the same bootstrap peers?",
            )
        )
        return None
    assert node.learner is not None and node.record is not None
    record = node.record
    checks.append(
        Check(
            "job",
            OK,
            f"{record.job_id} (task {record.task}, version {record.version}) "
            f"by learner {node.learner.to_base58()}: record found, signature valid",
        )
    )
    return node.learner, record


async def check_learner(host: IHost, learner: ID, timeout_s: float) -> Check:
    try:
        rtt = await ping(host, PeerInfo(learner, []), timeout_s)
        how = route(host.get_network().connections[learner][0])
    except Exception as exc:  # any failure of dial or stream: it does not answer
        return Check(
            "learner",
            FAIL,
            f"does not answer ({type(exc).__name__})",
            "the learner may be down or unreachable from here; try again later",
        )
    return Check("learner", OK, f"answers ping in {rtt * 1000:.1f} ms ({how} connection)")


def reachable_check(reach: Reachability, port: int | None) -> Check:
    answers = "; ".join(f"{p[-8:]}: {a}" for p, a in reach.answers.items())
    if reach.status == PUBLIC:
        return Check("reachable", OK, f"public: other peers can dial this node ({answers})")
    if reach.status == PRIVATE:
        return Check(
            "reachable",
            WARN,
            f"behind NAT or a firewall: nobody can dial this node ({answers})",
            "nothing is needed to work; to serve weights to more peers, forward TCP port "
            f"{port} on your router to this machine (and listen on a fixed port with --listen)",
        )
    return Check(
        "reachable",
        WARN,
        f"unknown: no dial-back answered ({answers})",
        "try again; the bootstrap peers may be busy",
    )


async def check_relay(swarm: Swarm, answering: list[PeerInfo], private: bool) -> Check:
    if not private:
        return Check("relay", OK, "not needed: other peers can dial this node")
    assert swarm.relay is not None
    held = [r for r in [await swarm.relay.reserve(info) for info in answering[:2]] if r]
    if held:
        return Check(
            "relay",
            OK,
            "reservation held on relay "
            + ", ".join(r.relay for r in held)
            + ": peers behind other routers can reach this node through it",
        )
    return Check(
        "relay",
        WARN,
        "no bootstrap peer granted a relay reservation: only peers this node dials itself can exchange weights with it",
        "ask the swarm's operator to run a relay (echo-bootstrap runs one)",
    )


async def check_hole_punch(host: IHost, helper: ID, port: int, timeout_s: float) -> Check:
    try:
        punch = await try_punch(host, helper, port, timeout_s)
    except Exception as exc:  # the probe itself failed: say so, it is not a verdict
        return Check("hole punch", WARN, f"could not try ({type(exc).__name__})", "")
    if punch.reached:
        return Check(
            "hole punch",
            OK,
            "a direct connection through your router works: peers behind other home routers can reach you directly",
        )
    return Check(
        "hole punch",
        WARN,
        f"failed ({punch.detail}): your router maps "
        "ports unpredictably or refuses replies, so other NATed peers "
        "reach you only through a relay",
        "turn on UPnP or forward the port above on your router",
    )


def check_disk(config: NodeConfig, version_bytes: int) -> Check:
    disk_dir = _existing_parent(config.data_dir)
    free = shutil.disk_usage(disk_dir).free
    need_disk = (config.keep_versions + 1) * version_bytes
    return Check(
        "disk",
        OK if free >= need_disk else FAIL,
        f"{config.keep_versions} versions need about {_mib(need_disk)}; {_mib(free)} free at {disk_dir}",
        "" if free >= need_disk else "free some disk or pass --data-dir on a larger disk",
    )


async def check_upload(host: IHost, helper: ID, timeout_s: float) -> Check:
    try:
        rate = await measure_upload(host, helper, timeout_s)
    except Exception as exc:  # the probe failed: report, do not guess
        return Check("upload", WARN, f"could not measure ({type(exc).__name__})", "")
    return Check("upload", OK, f"about {rate / 1e6:.1f} MB/s ({rate * 8 / 1e6:.0f} Mbit/s) to a bootstrap peer")


def _running_node(config: NodeConfig) -> Check | None:
    """A node running with this data dir, as the first finding (None if there is none)."""
    data = status.running(config.status_path)
    if data is None:
        return None
    reach = data.get("reachability", {}).get("status", "unknown")
    return Check(
        "node",
        OK,
        f"a node is running with this data dir (pid {data.get('pid')}, version {data.get('version')}, "
        f"reachability {reach}); the checks below use a throwaway identity and port, so they do not disturb it",
    )


def _listen_port(host) -> int:  # type: ignore[no-untyped-def]
    for addr in host.get_addrs():
        try:
            return int(addr.value_for_protocol("tcp"))
        except Exception:  # not a TCP address
            continue
    return 0


def _existing_parent(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def report(checks: list[Check]) -> dict:
    useful = not any(c.status == FAIL for c in checks)
    return {"ok": useful, "checks": [asdict(c) for c in checks], "checked_unix": round(time.time(), 1)}


def describe(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"{c.status:<5} {c.name:<11} {c.detail}")
        if c.fix:
            lines.append(f"{'':<17} -> {c.fix}")
    useful = not any(c.status == FAIL for c in checks)
    lines.append("this node can do useful work" if useful else "this node cannot do useful work yet (see fail above)")
    return "\n".join(lines)
