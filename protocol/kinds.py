"""Every message kind a frame may carry, gathered from the modules that own
them (for the codec's tests and the fuzzer)."""

from __future__ import annotations

from protocol import messages
from protocol.net import probe
from protocol.wire import chunk, have, receipts, rollout, work

EVERY_KIND: tuple[type, ...] = (
    work.WorkRequest,
    work.WorkAssignment,
    work.NoWork,
    rollout.RolloutBatch,
    rollout.Receipt,
    receipts.ReceiptQuery,
    receipts.ReceiptPage,
    chunk.ManifestRequest,
    chunk.ChunkRequest,
    chunk.ChunkData,
    have.Have,
    messages.Manifest,
    messages.Invite,
    messages.ErrorReply,
    probe.PunchRequest,
    probe.PunchReady,
    probe.PunchResult,
    probe.UploadSample,
    probe.UploadResult,
)
