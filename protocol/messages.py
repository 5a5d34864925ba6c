"""Every message Echo Swarm sends, with the type and bound of every field.

Field order is the wire order. ``docs/protocol.md`` documents the same
definitions for people writing other clients; keep the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from protocol.schema import Bool, Bytes, Float, Int, ListOf, Nested, Str, check

# Bounds shared by several messages. They are protocol constants, not tuning
# knobs: changing one is a protocol version change.
MAX_U53 = 2**53 - 1  # largest integer every msgpack implementation round-trips
MAX_JOB_ID = 64
MAX_PEER_ID = 128  # base58 Ed25519 peer ids are 52 characters
MAX_TOKEN_ID = 2**31 - 1
MAX_PROMPT_TOKENS = 1024
MAX_NEW_TOKENS = 1024
MAX_PROMPTS = 256
MAX_NAME = 32  # a node's display name (untrusted text: shown only as text)
MAX_GROUP = 64
MAX_CHUNKS = 65536
MAX_CHUNK_BYTES = 4 * 2**20
MAX_RECEIPTS_PER_PAGE = 500
SHA256 = Bytes(32, 32)
SIGNATURE = Bytes(64, 64)
PEER_ID = Str(MAX_PEER_ID)
JOB_ID = Str(MAX_JOB_ID)
VERSION = Int(0, MAX_U53)
TIME_MS = Int(0, MAX_U53)
TOKEN = Int(0, MAX_TOKEN_ID)
BACKENDS = ("torch", "llama")
DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_1")
VERDICTS = ("accepted", "refused")
# Whether a node can be dialled from outside (protocol.reachability, AutoNAT).
REACHABILITY = ("unknown", "public", "private")
MAX_ADDR = 256  # one multiaddr as text


# --- work protocol -----------------------------------------------------------


@dataclass(frozen=True)
class WorkRequest:
    """A node asks the learner for prompts to roll out."""

    job_id: str = field(metadata=check(JOB_ID))
    max_prompts: int = field(metadata=check(Int(1, MAX_PROMPTS)))
    held_version: int = field(metadata=check(Int(-1, MAX_U53)))
    backend: str = field(metadata=check(Str(16, BACKENDS)))
    dtype: str = field(metadata=check(Str(16, DTYPES)))
    name: str = field(metadata=check(Str(MAX_NAME)))
    # What the node's AutoNAT check found; the learner shows it on the status
    # page (whether the connection itself is relayed the learner sees itself).
    reachability: str = field(metadata=check(Str(16, REACHABILITY)))


@dataclass(frozen=True)
class Prompt:
    prompt_id: int = field(metadata=check(Int(0, MAX_U53)))
    tokens: tuple[int, ...] = field(metadata=check(ListOf(TOKEN, MAX_PROMPT_TOKENS, 1)))


@dataclass(frozen=True)
class WorkAssignment:
    """Prompts chosen by the learner; the node may not pick its own.

    ``version`` is the learner's newest policy; a node may generate with any
    version from ``min_version`` to ``version`` it already holds (async mode's
    staleness window; in sync mode the two are equal) and fetch the newest
    while it works.
    """

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(VERSION))
    min_version: int = field(metadata=check(VERSION))
    prompts: tuple[Prompt, ...] = field(metadata=check(ListOf(Nested(Prompt), MAX_PROMPTS, 1)))
    group_size: int = field(metadata=check(Int(1, MAX_GROUP)))
    max_new_tokens: int = field(metadata=check(Int(1, MAX_NEW_TOKENS)))
    temperature: float = field(metadata=check(Float(0.0, 10.0)))
    stop_token_ids: tuple[int, ...] = field(metadata=check(ListOf(TOKEN, 16)))
    deadline_ms: int = field(metadata=check(TIME_MS))


@dataclass(frozen=True)
class NoWork:
    """Nothing to hand out right now (e.g. the learner is training); ask again."""

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(VERSION))
    retry_after_ms: int = field(metadata=check(Int(0, 600_000)))
    reason: str = field(metadata=check(Str(200)))


# --- rollout protocol ----------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    tokens: tuple[int, ...] = field(metadata=check(ListOf(TOKEN, MAX_NEW_TOKENS)))
    # Log-prob of each sampled token under the node's weights (behaviour policy).
    logprobs: tuple[float, ...] = field(metadata=check(ListOf(Float(-1e4, 0.0), MAX_NEW_TOKENS)))


@dataclass(frozen=True)
class RolloutGroup:
    prompt_id: int = field(metadata=check(Int(0, MAX_U53)))
    completions: tuple[Completion, ...] = field(
        metadata=check(ListOf(Nested(Completion), MAX_GROUP, 1))
    )


@dataclass(frozen=True)
class RolloutBatch:
    """Completions for assigned prompts, signed by the node that made them."""

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(VERSION))
    peer_id: str = field(metadata=check(PEER_ID))
    nonce: bytes = field(metadata=check(Bytes(16, 16)))
    backend: str = field(metadata=check(Str(16, BACKENDS)))
    dtype: str = field(metadata=check(Str(16, DTYPES)))
    generate_ms: int = field(metadata=check(Int(0, MAX_U53)))
    groups: tuple[RolloutGroup, ...] = field(
        metadata=check(ListOf(Nested(RolloutGroup), MAX_PROMPTS, 1))
    )
    signature: bytes = field(metadata=check(SIGNATURE))


@dataclass(frozen=True)
class Receipt:
    """The learner's signed verdict on one rollout batch."""

    job_id: str = field(metadata=check(JOB_ID))
    batch_hash: bytes = field(metadata=check(SHA256))
    peer_id: str = field(metadata=check(PEER_ID))
    version: int = field(metadata=check(VERSION))
    verdict: str = field(metadata=check(Str(16, VERDICTS)))
    reason: str = field(metadata=check(Str(200)))
    tokens: int = field(metadata=check(Int(0, MAX_U53)))
    credit: float = field(metadata=check(Float(0.0, 1e15)))
    created_ms: int = field(metadata=check(TIME_MS))
    learner_id: str = field(metadata=check(PEER_ID))
    signature: bytes = field(metadata=check(SIGNATURE))


@dataclass(frozen=True)
class ReceiptQuery:
    """A node asks the learner for its own receipts (the learner answers only
    with receipts of the peer on the other end of the connection)."""

    job_id: str = field(metadata=check(JOB_ID))
    after_id: int = field(metadata=check(Int(0, MAX_U53)))
    limit: int = field(metadata=check(Int(1, MAX_RECEIPTS_PER_PAGE)))


@dataclass(frozen=True)
class ReceiptPage:
    """Receipts with ledger ids above the query's ``after_id``, oldest first;
    ask again from ``last_id`` while ``more`` is true."""

    job_id: str = field(metadata=check(JOB_ID))
    receipts: tuple[Receipt, ...] = field(
        metadata=check(ListOf(Nested(Receipt), MAX_RECEIPTS_PER_PAGE))
    )
    last_id: int = field(metadata=check(Int(0, MAX_U53)))
    more: bool = field(metadata=check(Bool()))


# --- weights -----------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """A policy version: what the weights are and how they are chunked."""

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(VERSION))
    parent_version: int = field(metadata=check(Int(-1, MAX_U53)))
    task: str = field(metadata=check(Str(64)))
    # Hugging Face config.json of the model, as JSON text.
    model_config: str = field(metadata=check(Str(16_384)))
    tokenizer_digest: bytes = field(metadata=check(SHA256))
    format: str = field(metadata=check(Str(16, ("safetensors",))))
    total_size: int = field(metadata=check(Int(0, MAX_CHUNKS * MAX_CHUNK_BYTES)))
    chunk_size: int = field(metadata=check(Int(1, MAX_CHUNK_BYTES)))
    chunk_hashes: tuple[bytes, ...] = field(metadata=check(ListOf(SHA256, MAX_CHUNKS)))
    created_ms: int = field(metadata=check(TIME_MS))
    learner_id: str = field(metadata=check(PEER_ID))
    signature: bytes = field(metadata=check(SIGNATURE))


@dataclass(frozen=True)
class ManifestRequest:
    """Ask a peer for a signed manifest it holds (``version`` -1: its newest)."""

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(Int(-1, MAX_U53)))


@dataclass(frozen=True)
class Have:
    """Which chunks of a version the sender holds (bit i of byte i // 8 is
    chunk i, least significant bit first). Sent on a have-stream whenever it
    changes."""

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(Int(-1, MAX_U53)))
    manifest_digest: bytes = field(metadata=check(Bytes(0, 32)))
    bitfield: bytes = field(metadata=check(Bytes(0, MAX_CHUNKS // 8)))


@dataclass(frozen=True)
class ChunkRequest:
    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(VERSION))
    index: int = field(metadata=check(Int(0, MAX_CHUNKS - 1)))


@dataclass(frozen=True)
class ChunkData:
    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(VERSION))
    index: int = field(metadata=check(Int(0, MAX_CHUNKS - 1)))
    data: bytes = field(metadata=check(Bytes(0, MAX_CHUNK_BYTES)))


# --- joining -----------------------------------------------------------------


@dataclass(frozen=True)
class Invite:
    """Everything a node needs to join one job, signed by its learner.

    ``echo-learner invite`` prints it as one string (``protocol.invite``);
    ``echo-node join <invite>`` trusts ``learner_id`` and nothing else.
    """

    job_id: str = field(metadata=check(JOB_ID))
    learner_id: str = field(metadata=check(PEER_ID))
    bootstrap: tuple[str, ...] = field(metadata=check(ListOf(Str(MAX_ADDR), 8)))
    # The learner's own dialable addresses (a shortcut past the DHT lookup).
    learner_addrs: tuple[str, ...] = field(metadata=check(ListOf(Str(MAX_ADDR), 8)))
    created_ms: int = field(metadata=check(TIME_MS))
    signature: bytes = field(metadata=check(SIGNATURE))


# --- probes a node runs against a public peer (echo-node doctor) ---------------


@dataclass(frozen=True)
class PunchRequest:
    """Try a TCP hole punch with me: I will dial you from my listen ``port``."""

    port: int = field(metadata=check(Int(1, 65535)))


@dataclass(frozen=True)
class PunchReady:
    """Dial me at ``port`` now; I am dialling your observed IP at your port."""

    port: int = field(metadata=check(Int(1, 65535)))


@dataclass(frozen=True)
class PunchResult:
    """Whether my dial to you got through (``detail``: why not)."""

    reached: bool = field(metadata=check(Bool()))
    detail: str = field(metadata=check(Str(200)))


@dataclass(frozen=True)
class UploadSample:
    """Bytes to time an upload with; an empty one ends the sample."""

    data: bytes = field(metadata=check(Bytes(0, 256 * 1024)))


@dataclass(frozen=True)
class UploadResult:
    """How many sample bytes arrived, over how long (first to last byte)."""

    received: int = field(metadata=check(Int(0, MAX_U53)))
    elapsed_ms: int = field(metadata=check(Int(0, MAX_U53)))


# --- shared ------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorReply:
    """A request refused before any answer could be given (unknown job, ...)."""

    code: str = field(metadata=check(Str(32)))
    message: str = field(metadata=check(Str(500)))


UNSIGNED = bytes(64)  # placeholder signature before signing


def unsigned(msg):  # type: ignore[no-untyped-def]
    """The same message with its signature zeroed (what a signature covers)."""
    return replace(msg, signature=UNSIGNED)
