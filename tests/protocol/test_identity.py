import dataclasses
import os
import stat

import pytest

from protocol import codec
from protocol.errors import SignatureError
from protocol.identity import Identity, KeyFileError, load, load_or_create, verify
from protocol.messages import UNSIGNED

from .samples import LEARNER, NODE, batch


def test_key_file_is_private_and_stable(tmp_path):
    path = tmp_path / "id" / "identity.key"
    first = load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create(path).peer_id_str == first.peer_id_str
    assert first.peer_id_str.startswith("12D3KooW")  # Ed25519 libp2p peer id


def test_world_readable_key_file_is_refused(tmp_path):
    path = tmp_path / "identity.key"
    load_or_create(path)
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load(path)


@pytest.mark.parametrize("content", ["", "zz" * 32, "ab" * 31])
def test_malformed_key_file_is_refused(tmp_path, content):
    path = tmp_path / "identity.key"
    path.write_text(content)
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError):
        load(path)


def test_missing_key_file_is_a_clear_error(tmp_path):
    with pytest.raises(KeyFileError, match="cannot read"):
        load(tmp_path / "absent.key")


def test_signed_batch_verifies():
    signed = batch()
    verify(signed, NODE.peer_id_str)


def test_batch_claimed_by_another_key_is_refused():
    # Signed by LEARNER's key, but claims to come from NODE.
    forged = batch(identity=LEARNER, peer_id=NODE.peer_id_str)
    with pytest.raises(SignatureError):
        verify(forged, forged.peer_id)


@pytest.mark.parametrize(
    "field, value",
    [("version", 4), ("nonce", b"m" * 16), ("dtype", "f16"), ("generate_ms", 13)],
)
def test_tampered_field_breaks_signature(field, value):
    signed = batch()
    tampered = dataclasses.replace(signed, **{field: value})
    with pytest.raises(SignatureError):
        verify(tampered, NODE.peer_id_str)


def test_tampered_logprob_breaks_signature():
    signed = batch()
    group = signed.groups[0]
    completion = dataclasses.replace(group.completions[0], logprobs=(-0.4, -1.25, -0.01))
    tampered = dataclasses.replace(
        signed, groups=(dataclasses.replace(group, completions=(completion, *group.completions[1:])),)
    )
    with pytest.raises(SignatureError):
        verify(tampered, NODE.peer_id_str)


def test_signature_is_bound_to_message_kind():
    # The same body signed under another kind's domain tag must not verify.
    signed = batch()
    tag, body = codec.canonical_bytes(signed).split(b"\0", 1)
    assert tag == b"echo-swarm/1/RolloutBatch"
    sig = NODE.sign_bytes(b"echo-swarm/1/Receipt\0" + body)
    with pytest.raises(SignatureError):
        verify(dataclasses.replace(signed, signature=sig), NODE.peer_id_str)


def test_garbage_peer_id_is_a_signature_error():
    with pytest.raises(SignatureError):
        verify(batch(), "not-a-peer-id")


def test_generated_identities_differ():
    assert Identity.generate().peer_id_str != Identity.generate().peer_id_str
    assert UNSIGNED == bytes(64)
