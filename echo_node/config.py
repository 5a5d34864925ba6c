"""The node's settings. Loadable without importing torch (``--help`` is instant)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from echo_node.device import DEVICES
from protocol.models.update_limits import UpdateLimits
from protocol.net.connlimits import ConnectionSettings
from protocol.process.config import setting


def default_data_dir() -> Path:
    return Path.home() / ".echo-swarm" / "node"


@dataclass(frozen=True)
class NodeConfig(ConnectionSettings, UpdateLimits):
    bootstrap: list[str] = setting([], "bootstrap peer multiaddr (with /p2p/<id>)")
    listen: list[str] = setting(["/ip4/0.0.0.0/tcp/0"], "multiaddr to listen on")
    data_dir: Path = setting(default_data_dir(), "identity, weight chunks and receipts live here")
    name: str = setting("", "display name on the learner's status page and leaderboard (<= 32 characters)")
    learner: str = setting("", "peer id of the learner to work for (default: the first found)")
    job_id: str = setting(
        "",
        "job to work for (default: the one this node last worked for, kept in DATA_DIR/job.json, else the one "
        "valid job listed; an invite sets it)",
    )
    # Backends and their dtypes are each backend's own (echo_node.backend_choice
    # checks them before anything starts).
    backend: str = setting("auto", "inference backend: auto (llama.cpp when installed, else torch), llama or torch")
    dtype: str = setting(
        "auto",
        "weight precision. llama.cpp: f32, f16 or q8_0 (2x and 4x smaller, a little less "
        "exact: the learner allows for it); auto: the most exact that fits in memory. torch: f32, bf16 "
        "or f16; auto: f32 on the CPU, bf16 (else f16) on a GPU",
    )
    device: str = setting(
        "auto",
        "where to generate: auto (the best that works: a GPU the backend can use, else the "
        "CPU), cpu, cuda, mps (Apple) or vulkan (llama.cpp only)",
        choices=DEVICES,
    )
    max_memory: float = setting(
        0.0,
        "most memory in GiB this node may use (RAM, or GPU memory on a GPU); 0: what is free, "
        "less 0.5 GiB left for other programs. Work that would not fit is run smaller or refused",
        lo=0,
    )
    max_prompts: int = setting(
        64,
        "most prompts to take per work request (the learner sizes each one to this node's speed, up to its "
        "--prompts-per-request)",
        lo=1,
        hi=256,
    )
    max_upload_mbit: float = setting(
        20.0,
        "upload bandwidth cap in Mbit/s for serving weights to peers (0: uncapped); the default keeps a "
        "home uplink usable for its owner and bounds what peers that only download can take",
        lo=0,
    )
    max_deliveries: int = setting(
        4,
        "most batches on their way to the learner at once (each waits for its verification)",
        lo=1,
        hi=64,
    )
    prefetch_below_s: float = setting(
        5.0,
        "ask for the next assignment while generating when one takes less than this "
        "(hides the request's round trip; slower nodes ask when done)",
        lo=0,
    )
    keep_versions: int = setting(2, "weight versions kept on disk (bounds disk use)", lo=1)
    max_disk_gb: float = setting(
        20.0,
        "most disk the weights may take: the kept versions plus the one downloading; a job "
        "whose versions need more is refused before anything is written",
        lo=0.001,
    )
    receipts_max_mb: float = setting(
        16.0,
        "receipts.jsonl is moved to receipts.jsonl.1 past this size (the learner's ledger keeps every receipt)",
        lo=0.01,
    )
    max_peers: int = setting(
        16,
        "swarm neighbours to dial for weights: at least this many, and this many per 20 Mbit/s "
        "of --max-upload-mbit, up to 128; peers that dial us are accepted up to twice that",
        lo=1,
    )
    threads: int = setting(
        0, "CPU threads for generation (0: physical cores minus one, so the volunteer keeps a core)", lo=0
    )
    request_timeout_s: float = setting(30.0, "deadline for one chunk or rollout request", lo=1)
    work_timeout_s: float = setting(
        30.0, "deadline for a work request (the learner may hold it until prompts are ready)", lo=1
    )
    discovery_timeout_s: float = setting(120.0, "how long to look for a learner before giving up", lo=1)
    retry_s: float = setting(1.0, "first pause before retrying a learner that did not answer", lo=0.05)
    max_retry_s: float = setting(30.0, "longest pause between retries (backoff doubles up to it)", lo=0.05)
    bootstrap_timeout_s: float = setting(10.0, "deadline to dial one bootstrap peer", lo=1)
    relay: bool = setting(
        False,
        "also relay for peers behind NAT (circuit relay v2, default limits); useful only on a machine others can dial",
    )
    mdns: bool = setting(
        True,
        "announce and look for peers on the local network (mDNS): on one LAN, no bootstrap address is needed",
    )
    upnp: bool = setting(
        True,
        "ask the home router to forward this node's port (UPnP-IGD), so that other peers can dial it directly",
    )
    lan_wait_s: float = setting(
        20.0, "with no bootstrap peer, how long to look for a learner on the LAN before giving up", lo=1
    )
    reachability_every_s: float = setting(
        300.0, "how often to re-check whether peers can dial this node (AutoNAT)", lo=5
    )
    emulate_tokens_per_s: float = setting(
        0.0,
        "testing aid: generate no faster than this many tokens/s (emulates a slower machine; 0: off)",
        lo=0,
    )
    emulate_delay_ms: float = setting(
        0.0,
        "testing aid: wait this long before each work request and rollout submission (emulates a wide-area link)",
        lo=0,
        hi=10_000,
    )

    @property
    def identity_path(self) -> Path:
        return self.data_dir / "identity.key"

    def weights_dir(self, job_id: str) -> Path:
        return self.data_dir / "weights" / job_id

    @property
    def gguf_dir(self) -> Path:
        """Where the llama.cpp backend writes its GGUF copy of the version it runs."""
        return self.data_dir / "gguf"

    @property
    def job_path(self) -> Path:
        """The job this node has worked for (``echo_node.job_memory``)."""
        return self.data_dir / "job.json"

    @property
    def receipts_path(self) -> Path:
        return self.data_dir / "receipts.jsonl"

    @property
    def status_path(self) -> Path:
        """What the running node writes for ``echo-node status``."""
        return self.data_dir / "status.json"
