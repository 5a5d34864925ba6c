"""The commands as a user runs them: help, one-line errors, persistent identity."""

import socket
import subprocess
import sys
import time

import pytest
from localswarm import local_swarm

DEAD = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWDqyh47JhwjZcD483yJfGRvEFHTKUeeMpc5XJpE6skuCW"
COMMANDS = {
    "echo_node": ["join"],
    "echo_learner": ["run"],
    "bootstrap": [],
}


def run(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("module", COMMANDS)
def test_help_explains(module):
    out = run(module, *COMMANDS[module], "--help")
    assert out.returncode == 0
    assert "--bootstrap" in out.stdout and "default:" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["echo_node", "join", "--no-such-flag"], "unrecognized arguments"),
        (["echo_node", "join", "--no-mdns"], "no bootstrap peer: paste the invite"),
        (["echo_node", "join", "echo1:AAAA"], "damaged or forged"),
        (["echo_node", "join", "http://example"], "an invite starts with"),
        (["echo_node", "status"], "no node is running"),
        (["echo_learner", "invite"], "holds no learner"),
        (["echo_node", "join", "--bootstrap", "not-an-addr", "--max-prompts", "0"], "outside"),
        (["echo_learner", "run", "--steps", "many"], "not a valid int"),
        (["echo_learner", "run", "--task", "chess"], "no task family 'chess'"),
        (["echo_learner", "run", "--task", "rg:basic_arithmetic"], "do not fit"),
        (
            ["echo_learner", "run", "--prompts-per-request", "256", "--group-size", "64", "--max-new-tokens", "100"],
            "over the rollout frame limit",
        ),
        (["echo_learner", "run", "--temperature", "0"], "outside"),
        (["bootstrap", "--listen", "/ip4/nonsense"], "not a multiaddr"),
        (["echo_learner", "run", "--mode", "eventually"], "invalid choice"),
        (["echo_learner", "run", "--staleness", "0"], "outside"),
        (["echo_learner", "run", "--resume"], "no checkpoint at"),
        (["echo_learner", "status"], "no running learner found"),
        (["echo_learner", "peers"], "no running learner found"),
        (["echo_learner", "ledger"], "cannot read the ledger"),
        (["echo_learner", "export", "/tmp/echo-export-never-written"], "no checkpoint at"),
        (["echo_node", "credits", "--bootstrap", DEAD], "no node identity"),
        (
            ["echo_node", "join", "--bootstrap", DEAD, "--backend", "cuda"],
            "no backend 'cuda': the node knows llama, torch",
        ),
        (
            ["echo_node", "join", "--bootstrap", DEAD, "--backend", "llama", "--dtype", "q2"],
            "runs f32, f16 or q8_0, not q2",
        ),
        (
            ["echo_node", "join", "--bootstrap", DEAD, "--backend", "torch", "--dtype", "q8_0"],
            "torch backend runs f32, bf16 or f16",
        ),
        (
            ["echo_node", "join", "--bootstrap", DEAD, "--backend", "llama", "--dtype", "bf16"],
            "llama.cpp backend runs f32, f16 or q8_0",
        ),
        (["echo_learner", "run", "--model", "/no/such/model.gguf"], "not a Hugging Face model directory"),
        (["echo_node", "join", "--bootstrap", DEAD, "--name", "x" * 33], "at most 32"),
        (["echo_node", "join", "--bootstrap", DEAD, "--device", "tpu"], "invalid choice"),
        (["echo_node", "join", "--bootstrap", DEAD, "--threads", "-1"], "outside"),
        (["echo_node", "join", "--bootstrap", DEAD, "--max-memory", "-2"], "outside"),
        # This machine has no GPU (CI's neither): asking for one says what to install.
        (
            ["echo_node", "join", "--bootstrap", DEAD, "--backend", "torch", "--device", "cuda"],
            "it needs a CUDA build of torch",
        ),
        (
            ["echo_node", "join", "--bootstrap", DEAD, "--backend", "torch", "--device", "vulkan"],
            "torch does not run on Vulkan",
        ),
        (["echo_learner", "run", "--device", "cuda"], "it needs a CUDA build of torch"),
        (["echo_learner", "run", "--device", "vulkan"], "invalid choice"),
        (["echo_learner", "eval", "--base", "--device", "cuda"], "it needs a CUDA build of torch"),
    ],
)
def test_bad_arguments_give_one_line(args, message, tmp_path):
    out = run(*args, "--data-dir" if args[0] != "bootstrap" else "--identity", str(tmp_path / "x"))
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr
    if args[:2] == ["echo_learner", "run"]:
        assert not (tmp_path / "x").exists(), "a refused run writes nothing"
    assert not (tmp_path / "x").exists()  # bad input changes nothing


def test_node_with_bad_bootstrap_address(tmp_path):
    out = run("echo_node", "join", "--bootstrap", "/ip4/127.0.0.1/tcp/1", "--data-dir", str(tmp_path))
    assert out.returncode == 2
    assert "/p2p/" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_node_with_unreachable_bootstrap(tmp_path):
    out = run("echo_node", "join", "--bootstrap", DEAD, "--data-dir", str(tmp_path), "--bootstrap-timeout-s", "2")
    assert out.returncode == 2
    assert "no bootstrap peer answered" in out.stderr


def test_bootstrap_identity_survives_restart(tmp_path):
    ids = []
    for _ in range(2):
        with local_swarm(tmp_path) as swarm:
            addr = swarm.start_bootstrap()
            ids.append(addr.rsplit("/p2p/", 1)[1])
            assert swarm.stop("bootstrap") == 0  # Ctrl-C is a clean exit
    assert ids[0] == ids[1]
    assert (tmp_path / "bootstrap.key").stat().st_mode & 0o777 == 0o600


def test_learner_refuses_to_overwrite_a_run_without_resume_or_fresh(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"a previous run")
    out = run("echo_learner", "run", "--data-dir", str(tmp_path), "--listen", "/ip4/127.0.0.1/tcp/0")
    assert out.returncode == 2
    assert "--resume" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert (tmp_path / "checkpoint.pt").read_bytes() == b"a previous run"  # untouched
    out = run("echo_learner", "run", "--data-dir", str(tmp_path), "--resume")
    assert out.returncode == 2, out.stderr
    assert "unreadable checkpoint" in out.stderr and "Traceback" not in out.stderr


def test_export_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    out = run("echo_learner", "export", str(tmp_path / "out"), "--data-dir", str(tmp_path))
    assert out.returncode == 2 and "not empty" in out.stderr
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("command", ["status", "peers", "ledger", "export"])
def test_learner_reader_commands_explain_themselves(command):
    out = run("echo_learner", command, "--help")
    assert out.returncode == 0 and "--data-dir" in out.stdout


def test_a_bad_address_creates_no_identity(tmp_path):
    for module, args in (
        ("echo_node", ["join", "--bootstrap", "/ip4/127.0.0.1/tcp/1", "--data-dir", str(tmp_path / "n")]),
        ("echo_learner", ["run", "--listen", "/ip4/nonsense", "--data-dir", str(tmp_path / "l")]),
    ):
        out = run(module, *args)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert not list(tmp_path.iterdir())


def test_an_operator_sets_the_handshake_deadline(tmp_path, monkeypatch):
    """A connection limit set by env var reaches the host: an idle socket is
    closed after 1 s instead of the default 10 s."""
    monkeypatch.setenv("ECHO_BOOTSTRAP_HANDSHAKE_TIMEOUT_S", "1")
    with local_swarm(tmp_path) as swarm:
        addr = swarm.start_bootstrap()
        port = int(addr.split("/tcp/")[1].split("/")[0])
        with socket.create_connection(("127.0.0.1", port), timeout=8) as idle:
            opened = time.monotonic()
            while idle.recv(1024):  # the multistream hello, then the close (or a timeout error)
                pass
            assert time.monotonic() - opened < 5


@pytest.mark.parametrize(
    "module, args",
    [
        ("bootstrap", ["--listen", "{addr}", "--identity", "{dir}/bootstrap.key"]),
        ("echo_learner", ["run", "--listen", "{addr}", "--data-dir", "{dir}"]),
        ("echo_learner", ["run", "--status-port", "{port}", "--data-dir", "{dir}"]),
        ("echo_node", ["join", "--listen", "{addr}", "--bootstrap", DEAD, "--data-dir", "{dir}"]),
    ],
)
def test_a_taken_listen_address_is_one_clear_line_and_writes_nothing(module, args, tmp_path):
    """py-libp2p only logs a listener it could not start and runs on with no
    address: an operator would see a peer that nobody can reach."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        addr = f"/ip4/127.0.0.1/tcp/{port}"
        out = run(module, *(a.format(addr=addr, port=port, dir=tmp_path / "x") for a in args))
    assert out.returncode == 2, out
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert str(port) in out.stderr and "Address already in use" in out.stderr, out.stderr
    assert not (tmp_path / "x").exists(), "a refused start writes nothing"
