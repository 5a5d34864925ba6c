"""Invites: one signed line that carries a job, its learner's key and addresses."""

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import codec, invite
from protocol.identity import Identity
from protocol.messages import Invite

LEARNER = Identity(bytes(range(32)))
BOOT = "/ip4/10.0.0.1/tcp/4001/p2p/12D3KooWEyoppNCUx8Yx66oV9fJnriXwCcXwDDUA2kj6vnc6iDEp"


def test_an_invite_round_trips_and_names_its_signer():
    text = invite.make(LEARNER, "reverse-abc", [BOOT], ["/ip4/10.0.0.2/tcp/4002"])
    assert text.startswith("echo1:") and "=" not in text and len(text) < 600
    parsed = invite.parse(text + "\n")  # pasted with its newline
    assert parsed.job_id == "reverse-abc"
    assert parsed.learner_id == LEARNER.peer_id_str
    assert parsed.bootstrap == (BOOT,)
    assert parsed.learner_addrs == ("/ip4/10.0.0.2/tcp/4002",)


def test_an_invite_signed_by_someone_else_is_refused():
    text = invite.make(LEARNER, "reverse-abc", [BOOT], [])
    raw = codec.decode(base64.urlsafe_b64decode(text[6:] + "=="), Invite)
    # Claim another learner's id on a body signed by ours.
    forged = raw.__class__(**{**raw.__dict__, "learner_id": Identity(bytes(32)).peer_id_str})
    text = "echo1:" + base64.urlsafe_b64encode(codec.encode(forged)).decode().rstrip("=")
    with pytest.raises(invite.BadInvite, match="forged"):
        invite.parse(text)


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "starts with"),
        ("echo2:abc", "starts with"),
        ("echo1:", "damaged"),
        ("echo1:!!!", "damaged"),
        ("echo1:" + "A" * 20000, "too long"),
    ],
)
def test_malformed_invites_are_refused_with_a_reason(text, why):
    with pytest.raises(invite.BadInvite, match=why):
        invite.parse(text)


def test_an_invite_with_a_bad_address_is_refused():
    text = invite.make(LEARNER, "j", ["/ip4/10.0.0.1/tcp/4001"], [])  # no /p2p/ part
    with pytest.raises(invite.BadInvite, match="bad address"):
        invite.parse(text)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=6, max_value=300), st.integers(min_value=0, max_value=63))
def test_every_single_character_change_is_caught(position, replacement):
    text = invite.make(LEARNER, "reverse-abc", [BOOT], ["/ip4/10.0.0.2/tcp/4002"])
    position = min(position, len(text) - 1)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    changed = text[:position] + alphabet[replacement] + text[position + 1 :]
    if changed == text:
        return
    try:
        parsed = invite.parse(changed)
    except invite.BadInvite:
        return
    # base64's last character can carry unused bits: then the bytes are equal.
    assert parsed == invite.parse(text)
