"""One-line invites: a learner-signed ``Invite`` as a string a volunteer can paste.

    echo-learner invite            ->  echo1:<base64url of the encoded Invite>
    echo-node join echo1:...

The string is the message's codec frame (``protocol.codec``) in URL-safe
base64 without padding, behind a version prefix. Decoding checks the size,
the schema, every address and the learner's signature over the whole
message, so a tampered or truncated invite is refused with a reason.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Sequence

from protocol import codec
from protocol.errors import ProtocolError
from protocol.identity import Identity, verify
from protocol.messages import UNSIGNED, Invite
from protocol.net.host import BadMultiaddr, parse_multiaddr, parse_peer_addr

PREFIX = "echo1:"


class BadInvite(ValueError):
    """An invite string that is malformed, tampered with or not for us."""


def make(identity: Identity, job_id: str, bootstrap: Sequence[str], learner_addrs: Sequence[str]) -> str:
    """Sign an invite to ``job_id`` and return it as one string."""
    invite = identity.sign(
        Invite(
            job_id=job_id,
            learner_id=identity.peer_id_str,
            bootstrap=tuple(bootstrap),
            learner_addrs=tuple(learner_addrs),
            created_ms=int(time.time() * 1000),
            signature=UNSIGNED,
        )
    )
    return PREFIX + base64.urlsafe_b64encode(codec.encode(invite)).decode().rstrip("=")


def parse(text: str) -> Invite:
    """The invite in ``text``, its signature and addresses checked; ``BadInvite`` otherwise."""
    text = text.strip()
    if not text.startswith(PREFIX):
        raise BadInvite(f"an invite starts with {PREFIX!r} (echo-learner invite prints one)")
    if len(text) > 2 * Invite.MAX_BYTES:
        raise BadInvite("the invite is too long")
    body = text[len(PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        invite = codec.decode(raw, Invite)
        verify(invite, invite.learner_id)
    except (binascii.Error, ValueError, ProtocolError) as exc:
        raise BadInvite(f"the invite is damaged or forged ({exc}); ask for a new one") from None
    try:
        for addr in invite.bootstrap:
            parse_peer_addr(addr)
        for addr in invite.learner_addrs:
            parse_multiaddr(addr)
    except BadMultiaddr as exc:
        raise BadInvite(f"the invite holds a bad address: {exc}") from None
    return invite
