import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol.codec import decode, encode
from protocol.errors import DecodeError, MessageTooLarge
from protocol.kinds import EVERY_KIND
from protocol.wire.chunk import ChunkData
from protocol.wire.rollout import RolloutBatch
from protocol.wire.work import WorkRequest

from .samples import all_messages, work_request

SAMPLES = all_messages()
REQUEST = work_request(job_id="j", max_prompts=1, reachability="public")


def test_samples_cover_every_kind():
    assert {type(m) for m in SAMPLES} == set(EVERY_KIND)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    assert decode(encode(msg), type(msg)) == msg


def test_wrong_kind_is_refused():
    data = encode(REQUEST)
    with pytest.raises(DecodeError, match="unexpected message kind"):
        decode(data, RolloutBatch)


def test_wrong_wire_version_is_refused():
    body = codec.to_wire(REQUEST)
    data = msgpack.packb([2, "WorkRequest", body])
    with pytest.raises(DecodeError, match="wire version"):
        decode(data, WorkRequest)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"max_prompts": 0}, "outside"),
        ({"max_prompts": True}, "expected int"),
        ({"backend": "b" * 17}, "longer than"),
        ({"job_id": "x" * 65}, "longer than"),
        ({"name": "x" * 33}, "longer than"),
        ({"device": "tpu"}, "not one of"),
        ({"memory_mib": -1}, "outside"),
        ({"tokens_per_s": float("nan")}, "outside"),
        ({"extra": 1}, "unknown fields"),
    ],
)
def test_field_checks(change, match):
    body = codec.to_wire(REQUEST)
    body.update(change)
    with pytest.raises(DecodeError, match=match):
        decode(msgpack.packb([1, "WorkRequest", body]), WorkRequest)


def test_missing_field_is_refused():
    body = codec.to_wire(REQUEST)
    del body["dtype"]
    with pytest.raises(DecodeError, match="missing fields"):
        decode(msgpack.packb([1, "WorkRequest", body]), WorkRequest)


def test_non_finite_logprob_is_refused():
    body = codec.to_wire(SAMPLES[3])
    body["groups"][0]["completions"][0]["logprobs"][0] = float("nan")
    with pytest.raises(DecodeError, match="outside"):
        decode(msgpack.packb([1, "RolloutBatch", body], use_bin_type=True), RolloutBatch)


def test_oversized_input_is_refused_before_parsing():
    limit = WorkRequest.MAX_BYTES
    # Not even msgpack: a size check that parsed first would report DecodeError.
    with pytest.raises(MessageTooLarge):
        decode(b"\xc1" * (limit + 1), WorkRequest)


def test_encode_refuses_oversized_message():
    encode(ChunkData("j", 1, 0, b"x" * (4 * 2**20)))  # the largest chunk fits
    with pytest.raises(MessageTooLarge):
        encode(ChunkData("j", 1, 0, b"x" * (4 * 2**20 + 2048)))


def test_truncated_frame_is_refused():
    data = encode(ChunkData("j", 1, 0, b"x" * 100))
    with pytest.raises(DecodeError):
        decode(data[:-1], ChunkData)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_random_bytes_raise_only_typed_errors(data):
    try:
        decode(data, *EVERY_KIND)
    except (DecodeError, MessageTooLarge):
        pass


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(SAMPLES),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_mutated_frames_raise_only_typed_errors(msg, flips):
    data = bytearray(encode(msg))
    for pos, value in flips:
        data[pos % len(data)] = value
    try:
        out = decode(bytes(data), type(msg))
    except (DecodeError, MessageTooLarge):
        return
    # A mutation that still decodes must give a well-formed message.
    assert type(out) is type(msg)
    assert decode(encode(out), type(msg)) == out


@settings(max_examples=200)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats()
        | st.text(max_size=20)
        | st.binary(max_size=20),
        lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
        max_leaves=30,
    )
)
def test_arbitrary_msgpack_bodies_raise_only_typed_errors(body):
    for kind in ("WorkRequest", "RolloutBatch", "Manifest"):
        data = msgpack.packb([1, kind, body], use_bin_type=True)
        with pytest.raises((DecodeError, MessageTooLarge)):
            decode(data, *EVERY_KIND)
