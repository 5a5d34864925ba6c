"""Dishonest nodes against a real learner process, beside honest node processes.

Each adversary is the real node code (in this test's process) with one
dishonesty added after an honest generation: forged log-probs, a replayed
batch, prompts it was not given, a version outside the window, garbage and
oversized frames, another node's id, another job. Each must be refused with
its own reason and earn no credit, the forger and the wrong-job sender must
end up banned, and the honest nodes must never see a refusal.
"""

import dataclasses
import json
import os
import re
import sqlite3
import struct
import urllib.request

import pytest
import trio

from echo_learner.verify.verifier import (
    BAD_LOGPROBS,
    MALFORMED,
    NOT_ASSIGNED,
    OUT_OF_WINDOW,
    REPLAYED,
    WRONG_JOB,
    WRONG_SIGNER,
)
from echo_node.backend_torch import TorchBackend
from echo_node.config import NodeConfig
from echo_node.node import Node
from protocol import framing
from protocol.identity import load_or_create, verify
from protocol.messages import UNSIGNED, ErrorReply
from protocol.rpc import RequestFailed, request
from protocol.wire import rollout, work
from protocol.wire.rollout import Completion, Receipt
from protocol.wire.work import WorkAssignment
from tests.protocol.samples import work_request

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def resign(node, batch, **changes):
    return node.identity.sign(dataclasses.replace(batch, signature=UNSIGNED, **changes))


def forge(node, batch, work):
    """Three batches whose log-probs claim every token was less likely than it was."""
    out = []
    for _ in range(3):
        groups = tuple(
            dataclasses.replace(
                g,
                completions=tuple(
                    Completion(c.tokens, tuple(max(lp - 0.5, -1e4) for lp in c.logprobs)) for c in g.completions
                ),
            )
            for g in batch.groups
        )
        out.append(resign(node, batch, groups=groups, nonce=os.urandom(16)))
    return out


def replay(node, batch, work):
    return [batch, batch]


def unassigned(node, batch, work):
    groups = tuple(dataclasses.replace(g, prompt_id=10**9 + i) for i, g in enumerate(batch.groups))
    return [resign(node, batch, groups=groups)]


def out_of_window(node, batch, work):
    return [resign(node, batch, version=work.version + 10)]


def wrong_job(node, batch, work):
    """Four batches for another job: three strikes, then banned (no ledger row)."""
    return [resign(node, batch, job_id=f"another-job-{i}", nonce=os.urandom(16)) for i in range(4)]


DISCONNECTED = "disconnected"


def heard(reply) -> str:
    return reply if reply == DISCONNECTED else reply.reason if isinstance(reply, Receipt) else reply.code


def as_expected(got: list[str], expected: list[str]) -> bool:
    """A banned peer hears "banned" once and is then disconnected: a request of
    its that was under way may hear either."""
    return len(got) == len(expected) and all(
        g == e or (e == "banned" and g == DISCONNECTED) for g, e in zip(got, expected, strict=True)
    )


class Adversary(Node):
    def __init__(self, config, identity, attack, victim=""):
        super().__init__(config, identity, TorchBackend(threads=1))
        self.attack = attack
        self.victim = victim
        self.replies = []
        self.done = trio.Event()

    async def roll_out(self, assignment: WorkAssignment) -> None:
        if self.done.is_set():
            await trio.sleep_forever()
        honest = await self.make_batch(assignment)
        if self.attack == "impersonate":
            # Claims to be the victim; can only sign with its own key.
            batches = [resign(self, honest, peer_id=self.victim)]
        elif self.attack == "garbage":
            batches = []
            for frame in (b"\xc1" * 64, None):
                self.replies.append(await self.raw_send(frame))
        else:
            batches = self.attack(self, honest, assignment)
        for batch in batches:
            try:
                self.replies.append(await self.submit(batch))
            except RequestFailed:
                # Cut off: banned, told so on another of its requests (its work loop's).
                self.replies.append(DISCONNECTED)
        self.done.set()

    async def raw_send(self, body):
        """A garbage frame, or (body None) a length prefix far over any limit."""
        stream = await self.swarm.host.new_stream(self.learner, [rollout.PROTOCOL])
        try:
            header = struct.pack(">I", 0x7FFF_FFFF if body is None else len(body))
            await stream.write(header + (body or b""))
            return await framing.receive(stream, ErrorReply)
        finally:
            await stream.close()


ATTACKS = {
    # The first forgery gives its prompts back; sending them again is no honest mistake.
    "forge": (forge, [BAD_LOGPROBS, NOT_ASSIGNED, NOT_ASSIGNED]),
    "replay": (replay, ["ok", REPLAYED]),
    "unassigned": (unassigned, [NOT_ASSIGNED]),
    "window": (out_of_window, [OUT_OF_WINDOW]),
    "wrong_job": (wrong_job, [WRONG_JOB, WRONG_JOB, WRONG_JOB, "banned"]),
    "impersonate": ("impersonate", [WRONG_SIGNER]),
    "garbage": ("garbage", [MALFORMED, MALFORMED]),
}


@pytest.mark.timeout(600)
@pytest.mark.slow
async def test_dishonest_nodes_are_refused_and_honest_ones_are_not(swarm_factory):
    swarm = swarm_factory
    boot = await trio.to_thread.run_sync(swarm.start_bootstrap)
    # Staleness 4: the forger's three batches, verified one after another, stay
    # inside the window while the learner keeps stepping.
    learner = swarm.start_learner("--mode", "async", "--staleness", "4", "--steps", "100000")
    for i in range(2):
        swarm.start_node(i)
    victim = load_or_create(swarm.root / "node0" / "identity.key").peer_id_str  # node0 reads this key
    adversaries = {}
    for name, (attack, _) in ATTACKS.items():
        config = NodeConfig(bootstrap=[boot], listen=[LOOPBACK], data_dir=swarm.root / f"adv-{name}")
        identity = load_or_create(config.identity_path)
        adversaries[name] = Adversary(config, identity, attack, victim)

    with trio.fail_after(400):
        async with trio.open_nursery() as nursery:
            for adv in adversaries.values():
                nursery.start_soon(adv.run)
            for adv in adversaries.values():
                await adv.done.wait()
            # The forger struck three times: it is banned from work too.
            # Told "banned" once (here or on its own work loop's request), it
            # is disconnected, and its next connection is refused as soon as
            # Noise names it (a request already on its way may still be told).
            forger = adversaries["forge"]
            for _ in range(5):
                try:
                    reply = await _ask_for_work(forger)
                except RequestFailed:
                    break
                assert isinstance(reply, ErrorReply) and reply.code == "banned"
            else:
                pytest.fail("a banned peer was never disconnected")
            with pytest.raises(RequestFailed):
                await _ask_for_work(forger)  # a fresh connection, refused
            nursery.cancel_scope.cancel()

    # Let the honest nodes work past the attacks, then look at the refusals the
    # way an operator (or the status page) does, then stop everything.
    await trio.to_thread.run_sync(lambda: _wait_for_steps(swarm, 30, learner))
    await trio.to_thread.run_sync(_check_the_api, swarm, adversaries)
    codes = await trio.to_thread.run_sync(swarm.stop_all)
    assert set(codes.values()) == {0}, codes

    learner_ids = set()
    for name, adv in adversaries.items():
        expected = ATTACKS[name][1]
        got = [heard(r) for r in adv.replies]
        assert as_expected(got, expected), (name, got)
        for r in adv.replies:
            if isinstance(r, Receipt):
                verify(r, adv.learner.to_base58())
                learner_ids.add(r.learner_id)
                assert (r.credit > 0) == (r.reason == "ok")

    db = sqlite3.connect(swarm.root / "learner" / "ledger.sqlite")
    for name, adv in adversaries.items():
        rows = db.execute("SELECT reason, credit FROM verdicts WHERE peer = ? ORDER BY id", (adv.me,)).fetchall()
        # A banned peer's batch is answered ErrorReply("banned") unread: no row.
        assert [r for r, _ in rows] == [r for r in ATTACKS[name][1] if r != "banned"], name
        assert all(credit == 0 for reason, credit in rows if reason != "ok"), name
    # The impersonated node was not charged with the forgery, and no honest
    # node was ever refused.
    for i in range(2):
        lines = (swarm.root / f"node{i}" / "receipts.jsonl").read_text().splitlines()
        verdicts = [json.loads(line)["verdict"] for line in lines]
        assert verdicts and set(verdicts) == {"accepted"}, (i, verdicts[-5:])
    (honest_refused,) = db.execute(
        f"SELECT COUNT(*) FROM verdicts WHERE verdict = 'refused' AND peer NOT IN ({','.join('?' * len(adversaries))})",
        [a.me for a in adversaries.values()],
    ).fetchone()
    assert honest_refused == 0
    assert len(learner_ids) == 1  # every receipt signed by the one learner


async def _ask_for_work(node):
    req = work_request(job_id=node.job_id, held_version=node.version)
    return await request(
        node.swarm.host, node.learner, work.PROTOCOL, lambda stream: work.ask(stream, req), timeout_s=30
    )


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def _check_the_api(swarm, adversaries):
    """/api/refusals, /api/receipts and /metrics agree with what the adversaries were told."""
    url = json.loads((swarm.root / "learner" / "api.json").read_text())["url"].rstrip("/")
    refusals = json.loads(_get(url + "/api/refusals"))["refusals"]
    by_peer = {}
    for r in reversed(refusals):  # newest first on the wire
        by_peer.setdefault(r["peer"], []).append(r["reason"])
    for name, adv in adversaries.items():
        # Listed are the ledger's refused rows: a banned peer's batch has none.
        assert by_peer.get(adv.me, []) == [x for x in ATTACKS[name][1] if x not in ("ok", "banned")], name
    assert set(by_peer) == {adv.me for adv in adversaries.values()}  # no honest node listed

    replayer = adversaries["replay"]
    receipts = json.loads(_get(f"{url}/api/receipts?peer={replayer.me}"))["receipts"]
    assert [(r["verdict"], r["reason"]) for r in receipts] == [("accepted", "ok"), ("refused", REPLAYED)]
    assert receipts[0]["credit"] > 0 and receipts[0]["tokens"] > 0 and receipts[1]["credit"] == 0

    # The banned forger's last connection was refused (see the test).
    assert json.loads(_get(url + "/api/status"))["banned_connections_refused"] >= 1

    metrics = _get(url + "/metrics")
    for reason in (BAD_LOGPROBS, NOT_ASSIGNED):
        told = sum(ATTACKS[name][1].count(reason) for name in ATTACKS)
        found = re.search(r'echo_batches_refused_total\{reason="' + reason + r'"\} (\d+)', metrics)
        assert found and int(found.group(1)) == told, (reason, metrics)


def _wait_for_steps(swarm, steps, learner):
    import time

    deadline = time.monotonic() + 300
    while len(swarm.metrics()) < steps:
        assert learner.poll() is None, (swarm.root / "learner.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "learner did not reach the steps"
        time.sleep(0.5)  # polling the learner's metrics file
