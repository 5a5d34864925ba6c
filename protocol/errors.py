"""The small, documented set of errors the protocol layer raises.

Two kinds, as in h11: ``ProtocolError`` means the *peer* misbehaved (bad bytes,
bad signature, oversized frame) and is caught at the connection boundary;
everything else is a bug on our side and propagates.
"""


class ProtocolError(Exception):
    """The remote peer sent something we refuse. Safe to catch per connection."""


class DecodeError(ProtocolError):
    """Bytes that are not a well-formed message of the expected kind."""


class MessageTooLarge(ProtocolError):
    """A frame or message larger than the limit for its kind; refused unread."""


class SignatureError(ProtocolError):
    """A signature that does not verify, or a signer that is not who it claims."""


class StreamClosed(ProtocolError):
    """The stream ended before a whole frame arrived.

    A killed sender looks like a clean end of stream in py-libp2p, so a short
    frame is the only sign that the remote died mid-message.
    """

    def __init__(self, message: str, received: int = 0):
        super().__init__(message)
        self.received = received  # bytes of the cut-short read that did arrive


class ChunkHashMismatch(ProtocolError):
    """A weight chunk whose hash differs from the signed manifest."""
