"""Valid messages of every kind, for round-trip and fuzz tests."""

from protocol import manifest
from protocol.identity import Identity
from protocol.messages import UNSIGNED, ErrorReply, Invite
from protocol.net.probe import PunchReady, PunchRequest, PunchResult, UploadResult, UploadSample
from protocol.wire.chunk import ChunkData, ChunkRequest, ManifestRequest
from protocol.wire.have import Have
from protocol.wire.receipts import ReceiptPage, ReceiptQuery
from protocol.wire.rollout import Completion, Receipt, RolloutBatch, RolloutGroup
from protocol.wire.work import NoWork, Prompt, WorkAssignment, WorkRequest

NODE = Identity(bytes(range(32)))
LEARNER = Identity(bytes(range(1, 33)))


def batch(identity: Identity = NODE, **overrides) -> RolloutBatch:
    fields = dict(
        job_id="reverse-test",
        version=3,
        peer_id=identity.peer_id_str,
        nonce=b"n" * 16,
        backend="torch",
        dtype="f32",
        device="cpu",
        generate_ms=12,
        groups=(RolloutGroup(7, (Completion((97, 98, 258), (-0.5, -1.25, -0.01)), Completion((99,), (-2.0,)))),),
        signature=UNSIGNED,
    )
    fields.update(overrides)
    return identity.sign(RolloutBatch(**fields))


def patterned_version(job_id: str, *, chunk_size: int, n_chunks: int) -> tuple:
    """Version 1 of ``job_id``, signed by ``LEARNER``: its manifest and its
    ``n_chunks`` chunks of patterned bytes."""
    return manifest.build(
        LEARNER,
        job_id=job_id,
        version=1,
        parent_version=0,
        task="reverse",
        model_config="{}",
        tokenizer_digest=b"t" * 32,
        weights=bytes(range(256)) * (n_chunks * chunk_size // 256),
        chunk_size=chunk_size,
    )


def work_request(**fields) -> WorkRequest:
    """A work request as a torch f32 node on a CPU sends it; ``fields`` override."""
    sent = dict(
        job_id="reverse-test",
        max_prompts=4,
        held_version=-1,
        backend="torch",
        dtype="f32",
        name="",
        reachability="unknown",
        device="cpu",
        memory_mib=0,
        tokens_per_s=0.0,
    )
    return WorkRequest(**{**sent, **fields})


def all_messages() -> list:
    signed_manifest, _ = manifest.build(
        LEARNER,
        job_id="reverse-test",
        version=1,
        parent_version=0,
        task="reverse",
        model_config="{}",
        tokenizer_digest=b"t" * 32,
        weights=b"w" * 3000,
        chunk_size=1024,
    )
    receipt = LEARNER.sign(
        Receipt(
            "reverse-test", b"h" * 32, NODE.peer_id_str, 3, "accepted", "ok", 4, 4.0, 1, LEARNER.peer_id_str, UNSIGNED
        )
    )
    return [
        work_request(
            name="node <b>one</b>", reachability="private", device="cuda", memory_mib=8192, tokens_per_s=1234.5
        ),
        WorkAssignment("reverse-test", 3, 1, (Prompt(1, (257, 97, 98, 99, 61)),), 16, 4, 1.0, (258,), 99),
        NoWork("reverse-test", 3, 0, "all prompts taken"),
        batch(),
        receipt,
        ReceiptQuery("reverse-test", 0, 100),
        ReceiptPage("reverse-test", (receipt, receipt), 17, True),
        signed_manifest,
        ManifestRequest("reverse-test", -1),
        Have("reverse-test", 1, b"d" * 32, b"\x0f"),
        ChunkRequest("reverse-test", 1, 2),
        ChunkData("reverse-test", 1, 2, b"\x00" * 100),
        ErrorReply("unknown_job", "no such job"),
        LEARNER.sign(
            Invite(
                "reverse-test",
                LEARNER.peer_id_str,
                ("/ip4/10.0.0.1/tcp/4001/p2p/" + NODE.peer_id_str,),
                ("/ip4/10.0.0.2/tcp/4002",),
                5,
                UNSIGNED,
            )
        ),
        PunchRequest(4001),
        PunchReady(50123),
        PunchResult(False, "no answer"),
        UploadSample(b"\x00" * 1000),
        UploadResult(262144, 120),
    ]
