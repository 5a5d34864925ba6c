"""The bounds every message is checked against, and the messages that are not
one protocol's own: the signed ``Manifest`` (served on the chunk protocol,
published in the DHT, kept on disk), the signed ``Invite`` and ``ErrorReply``.

Each stream protocol's own messages live in its module under
``protocol.wire``. Field order is the wire order; ``MAX_BYTES`` is the
largest encoded size of a kind (``protocol.codec`` refuses bigger frames
unread). ``docs/protocol.md`` documents the same definitions for people
writing other clients; keep the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from protocol.schema import Bytes, Int, ListOf, Str, check

KiB = 1024
MiB = 1024 * KiB

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
SHA256 = Bytes(32, 32)
SIGNATURE = Bytes(64, 64)
PEER_ID = Str(MAX_PEER_ID)
JOB_ID = Str(MAX_JOB_ID)
VERSION = Int(0, MAX_U53)
TIME_MS = Int(0, MAX_U53)
TOKEN = Int(0, MAX_TOKEN_ID)
# The node's inference backend, as the backend names itself (echo_node's
# BackendSpec): any short name; the learner refuses rollouts of a backend and
# dtype it has no tolerance for (unsupported_dtype).
BACKEND = Str(16)
DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_1")
VERDICTS = ("accepted", "refused")
# Whether a node can be dialled from outside (protocol.net.reachability, AutoNAT).
REACHABILITY = ("unknown", "public", "private")
# Where a node generates (echo_node.device).
DEVICE_KINDS = ("cpu", "cuda", "mps", "vulkan")
MAX_ADDR = 256  # one multiaddr as text
MAX_TASK = 256  # a task spec, options included (rg:name:option=value,...)


# --- signed documents -------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """A policy version: what the weights are and how they are chunked."""

    MAX_BYTES: ClassVar[int] = 4 * MiB

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(VERSION))
    parent_version: int = field(metadata=check(Int(-1, MAX_U53)))
    task: str = field(metadata=check(Str(MAX_TASK)))
    # Hugging Face config.json of the model, as JSON text.
    model_config: str = field(metadata=check(Str(16_384)))
    tokenizer_digest: bytes = field(metadata=check(SHA256))
    # What the chunks hold (protocol.models.updates): "safetensors" (full weights),
    # "delta" or "lora" (an update against base_version, named by the digest
    # of its manifest), or "gguf_q8_0" (a variant: base_version's weights,
    # version == base_version, as a llama.cpp q8_0 GGUF). weights_digest:
    # SHA-256 of the file the chunks make once decoded (the full weights;
    # for "lora", the adapter file; for a variant, the GGUF).
    format: str = field(metadata=check(Str(16, ("safetensors", "delta", "lora", "gguf_q8_0"))))
    base_version: int = field(metadata=check(Int(-1, MAX_U53)))
    base_digest: bytes = field(metadata=check(Bytes(0, 32)))
    weights_digest: bytes = field(metadata=check(SHA256))
    total_size: int = field(metadata=check(Int(0, MAX_CHUNKS * MAX_CHUNK_BYTES)))
    chunk_size: int = field(metadata=check(Int(1, MAX_CHUNK_BYTES)))
    chunk_hashes: tuple[bytes, ...] = field(metadata=check(ListOf(SHA256, MAX_CHUNKS)))
    created_ms: int = field(metadata=check(TIME_MS))
    learner_id: str = field(metadata=check(PEER_ID))
    signature: bytes = field(metadata=check(SIGNATURE))


@dataclass(frozen=True)
class Invite:
    """Everything a node needs to join one job, signed by its learner.

    ``echo-learner invite`` prints it as one string (``protocol.invite``);
    ``echo-node join <invite>`` trusts ``learner_id`` and nothing else.
    """

    MAX_BYTES: ClassVar[int] = 6 * KiB

    job_id: str = field(metadata=check(JOB_ID))
    learner_id: str = field(metadata=check(PEER_ID))
    bootstrap: tuple[str, ...] = field(metadata=check(ListOf(Str(MAX_ADDR), 8)))
    # The learner's own dialable addresses (a shortcut past the DHT lookup).
    learner_addrs: tuple[str, ...] = field(metadata=check(ListOf(Str(MAX_ADDR), 8)))
    created_ms: int = field(metadata=check(TIME_MS))
    signature: bytes = field(metadata=check(SIGNATURE))


# --- shared ------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorReply:
    """A request refused before any answer could be given (unknown job, ...)."""

    MAX_BYTES: ClassVar[int] = 2 * KiB

    code: str = field(metadata=check(Str(32)))
    message: str = field(metadata=check(Str(500)))


# The error code every request protocol answers a request for another job with.
UNKNOWN_JOB = "unknown_job"

UNSIGNED = bytes(64)  # placeholder signature before signing


def unsigned(msg):  # type: ignore[no-untyped-def]
    """The same message with its signature zeroed (what a signature covers)."""
    return replace(msg, signature=UNSIGNED)
