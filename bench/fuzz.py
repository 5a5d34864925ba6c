"""Fuzz every decoder a stranger's bytes reach, with hypothesis: count crashes.

Each target takes bytes (or text) a peer controls and must either give a
well-formed value or raise the error it documents (``ProtocolError`` and its
kinds, ``InvalidRecord``, ``BadInvite``, the node's ``Refused``); anything
else is a crash. Every
``TRACE_EVERY``-th case runs under tracemalloc: a peak far beyond the input's
size would be an unbounded allocation (inputs are at most a few KiB, the
largest valid sample a 1 MiB chunk; the limit is ``MAX_PEAK_MIB``). The
update targets (``bench/fuzz_updates.py``) run every case under tracemalloc,
against the bound the node allows for that input (``over_bound``).

    python bench/fuzz.py --json                 # 200,000 cases, a few minutes
    python bench/fuzz.py --cases 5000           # a quick look
    python bench/fuzz.py --json --targets delta_frames,adapter_files,adapter_headers

Prints ``{"cases": N, "crashes": 0, "unbounded_allocations": 0, "targets": {...}}``
(``unbounded_allocations`` counts targets over ``MAX_PEAK_MIB`` and cases over
their own bound).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import msgpack
import trio
import trio.testing
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fuzz_updates import PEAK_BOUNDS  # noqa: E402
from bench.fuzz_updates import targets as update_targets  # noqa: E402
from echo_learner.operator.api import Server, _handle  # noqa: E402
from echo_node.guard import weight_elements  # noqa: E402
from echo_node.model_shape import model_shape  # noqa: E402
from echo_node.refusals import Refused  # noqa: E402
from protocol import codec, framing, invite  # noqa: E402
from protocol.broadcast import bitfield  # noqa: E402
from protocol.errors import ProtocolError  # noqa: E402
from protocol.ids import DHT_NAMESPACE  # noqa: E402
from protocol.kinds import EVERY_KIND  # noqa: E402
from protocol.net.records import InvalidRecord, decode_record  # noqa: E402
from tests.protocol.samples import LEARNER, all_messages  # noqa: E402
from tests.protocol.test_framing import pair  # noqa: E402

MAX_PEAK_MIB = 64
TRACE_EVERY = 25
SAMPLES = all_messages()
EXPECTED = (ProtocolError, InvalidRecord, invite.BadInvite, Refused)

MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=64),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=20,
)
FLIPS = st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=8)


def mutate(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for pos, value in flips:
        out[pos % len(out)] = value
    return bytes(out)


# --- targets: each takes one generated input ---------------------------------------


def codec_random_bytes(data: bytes) -> None:
    codec.decode(data, *EVERY_KIND)


def codec_mutated(case: tuple) -> None:
    msg, flips = case
    out = codec.decode(mutate(codec.encode(msg), flips), type(msg))
    assert codec.decode(codec.encode(out), type(msg)) == out  # what decodes is well-formed


def codec_msgpack_bodies(case: tuple) -> None:
    kind, body = case
    codec.decode(msgpack.packb([codec.WIRE_VERSION, kind, body], use_bin_type=True), *EVERY_KIND)


def framing_stream(data: bytes) -> None:
    """A peer's raw bytes on a stream: frames read one after another until it ends."""

    async def read_all() -> None:
        peer, ours = pair()
        await peer.write(data)
        await peer.close()
        while await framing.receive_or_end(ours, *EVERY_KIND) is not None:
            pass

    trio.run(read_all)


def dht_record(case: tuple) -> None:
    value, flips = case
    decode_record(f"/{DHT_NAMESPACE}/{LEARNER.peer_id_str}", mutate(value, flips) if flips else value)


def invite_text(text: str) -> None:
    invite.parse(text)


def bitfield_bytes(case: tuple) -> None:
    data, n = case
    chunks = bitfield.decode(data, n)
    assert all(0 <= c < n for c in chunks)


def http_request(data: bytes) -> None:
    """Bytes sent to the status API (the table answers every path)."""
    server = Server.for_table({"/api/status": lambda q: {"ok": True}})

    async def exchange() -> None:
        client, served = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_handle, served, server)
            await client.send_all(data)
            await client.send_eof()
            with trio.move_on_after(1):
                while await client.receive_some(65536):
                    pass

    trio.run(exchange)


def version_files(case: tuple) -> None:
    """A version's safetensors bytes and model config, as a node checks them."""
    weights, config = case
    weight_elements(weights)
    model_shape(config)


def small_safetensors() -> bytes:
    import numpy as np
    from safetensors.numpy import save

    return save({"embed": np.zeros((4, 8), np.float32), "norm": np.ones(8, np.float16)})


CONFIG = json.dumps(
    {
        "vocab_size": 4,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "tie_word_embeddings": True,
    }
)


def valid_invite() -> str:
    return invite.make(
        LEARNER, "reverse-fuzz", ["/ip4/127.0.0.1/tcp/4001/p2p/" + LEARNER.peer_id_str], ["/ip4/127.0.0.1/tcp/4002"]
    )


def manifest_value() -> bytes:
    return codec.encode(next(m for m in SAMPLES if type(m).__name__ == "Manifest"))


TARGETS: dict[str, tuple[Callable, st.SearchStrategy, float]] = {
    # name: (target, inputs, share of the cases)
    "codec_random_bytes": (codec_random_bytes, st.binary(max_size=4096), 0.15),
    "codec_mutated": (codec_mutated, st.tuples(st.sampled_from(SAMPLES), FLIPS), 0.2),
    "codec_msgpack_bodies": (
        codec_msgpack_bodies,
        st.tuples(st.sampled_from(sorted(k.__name__ for k in EVERY_KIND)), MSGPACK_VALUES),
        0.1,
    ),
    "framing_stream": (framing_stream, st.binary(max_size=4096), 0.15),
    "dht_record": (
        dht_record,
        st.tuples(
            st.just(manifest_value()) | st.binary(max_size=2048),
            st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=8),
        ),
        0.1,
    ),
    "invite": (
        invite_text,
        st.text(max_size=600)
        | st.builds(lambda f: valid_invite()[: f % 700] + "A" * (f % 3), st.integers(0, 10**6))
        | st.builds(lambda t: "echo1:" + t, st.text(max_size=600)),
        0.1,
    ),
    "bitfield": (bitfield_bytes, st.tuples(st.binary(max_size=64), st.integers(1, 512)), 0.1),
    "http_request": (
        http_request,
        st.binary(max_size=2048)
        | st.builds(
            lambda path, head: f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n\r\n".encode("utf-8", "replace"),
            st.text(max_size=100),
            st.text(max_size=300),
        ),
        0.05,
    ),
    "version_files": (
        version_files,
        st.tuples(
            st.just(small_safetensors())
            | st.builds(mutate, st.just(small_safetensors()), FLIPS)
            | st.binary(max_size=512),
            st.just(CONFIG)
            | st.builds(lambda flips: mutate(CONFIG.encode(), flips).decode("utf-8", "replace"), FLIPS)
            | st.text(max_size=200),
        ),
        0.05,
    ),
    # Their shares add up to another whole: --cases N runs N update cases besides.
    **update_targets(mutate, FLIPS),
}


def run_target(name: str, cases: int) -> dict:
    fn, inputs, _ = TARGETS[name]
    seen = {"cases": 0, "refused": 0, "crashes": 0, "examples": [], "peak_alloc_mib": 0.0}
    bound = PEAK_BOUNDS.get(name)
    if bound is not None:
        seen["over_bound"] = 0

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(inputs)
    def body(x) -> None:  # type: ignore[no-untyped-def]
        seen["cases"] += 1
        traced = bound is not None or seen["cases"] % TRACE_EVERY == 0
        if traced:
            tracemalloc.start()
        try:
            fn(x)
        except EXPECTED:
            seen["refused"] += 1
        except Exception as exc:  # a crash: recorded, not raised (no shrinking, keep counting)
            seen["crashes"] += 1
            if len(seen["examples"]) < 3:
                seen["examples"].append(f"{type(exc).__name__}: {exc!s:.200} on {x!r:.200}")
        finally:
            if traced:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                seen["peak_alloc_mib"] = round(max(seen["peak_alloc_mib"], peak / 2**20), 2)
                if bound is not None and peak > bound(x):
                    seen["over_bound"] += 1
                    if len(seen["examples"]) < 3:
                        seen["examples"].append(f"{peak} bytes allocated, over {bound(x)}, on {x!r:.200}")

    started = time.monotonic()
    body()
    seen["seconds"] = round(time.monotonic() - started, 1)
    if not seen["examples"]:
        del seen["examples"]
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=100_000, help="cases in all, shared among the targets")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--targets", default="", help="comma-separated targets to run (default: all)")
    args = parser.parse_args()
    chosen = [t for t in args.targets.split(",") if t] or list(TARGETS)
    unknown = sorted(set(chosen) - set(TARGETS))
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    results = {}
    for name, (_, _, share) in ((n, TARGETS[n]) for n in chosen):
        results[name] = run_target(name, max(1, int(args.cases * share)))
        if not args.json:
            print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
    out = {
        "cases": sum(r["cases"] for r in results.values()),
        "crashes": sum(r["crashes"] for r in results.values()),
        "unbounded_allocations": sum(
            (r["peak_alloc_mib"] > MAX_PEAK_MIB) + r.get("over_bound", 0) for r in results.values()
        ),
        "targets": results,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
