"""Strikes and bans from a downloader's side (``protocol.broadcast.penalties``)."""

from protocol.broadcast.penalties import Penalties
from protocol.broadcast.settings import BroadcastConfig, Stats


async def test_a_peer_is_banned_at_its_second_stall_whether_or_not_it_ever_served_us():
    """Banned at its first stall, an honest node slow once in its first
    version (a stranger to everyone) was banned by both other nodes, which
    then waited seed_retry_s at every version (bench/attacks.py, sync)."""
    banned: list[str] = []
    penalties = Penalties(BroadcastConfig(stalls_to_ban=2, ban_s=600.0), Stats(), on_ban=banned.append)
    penalties.strike("stranger")
    assert not penalties.banned("stranger") and banned == []
    penalties.strike("stranger")
    assert penalties.banned("stranger") and banned == ["stranger"]
    assert not penalties.banned("another")
