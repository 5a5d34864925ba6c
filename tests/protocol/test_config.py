from dataclasses import dataclass
from pathlib import Path

import pytest

from protocol.process.config import ConfigError, Parser, add_arguments, resolve, setting


@dataclass(frozen=True)
class Cfg:
    steps: int = setting(10, "steps", lo=1)
    lr: float = setting(0.5, "lr", lo=0.0, hi=1.0)
    peers: list[str] = setting([], "peers")
    data_dir: Path = setting(Path("/tmp/x"), "dir")
    fast: bool = setting(False, "fast")


def parse(argv, env=None, monkeypatch=None):
    parser = Parser(prog="t")
    add_arguments(parser, Cfg)
    return resolve(Cfg, parser.parse_args(argv), "T")


def test_defaults():
    assert parse([]) == Cfg()


def test_flag_beats_env_beats_file(tmp_path, monkeypatch):
    toml = tmp_path / "c.toml"
    toml.write_text('steps = 3\nlr = 0.25\npeers = ["a", "b"]\n')
    assert parse(["--config", str(toml)]).steps == 3
    monkeypatch.setenv("T_STEPS", "4")
    cfg = parse(["--config", str(toml)])
    assert (cfg.steps, cfg.lr, cfg.peers) == (4, 0.25, ["a", "b"])
    assert parse(["--config", str(toml), "--steps", "5"]).steps == 5


def test_list_flags_repeat_and_env_splits(monkeypatch):
    assert parse(["--peers", "x", "--peers", "y"]).peers == ["x", "y"]
    monkeypatch.setenv("T_PEERS", "p,q")
    assert parse([]).peers == ["p", "q"]
    assert parse(["--fast"]).fast is True


@pytest.mark.parametrize(
    "argv, match",
    [(["--steps", "0"], "outside"), (["--steps", "x"], "not a valid int"), (["--lr", "2"], "outside")],
)
def test_bad_values_are_one_line_errors(argv, match):
    with pytest.raises(ConfigError, match=match):
        parse(argv)


def test_bad_config_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse(["--config", str(bad)])
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("stepz = 1\n")
    with pytest.raises(ConfigError, match="unknown settings"):
        parse(["--config", str(unknown)])
    with pytest.raises(ConfigError, match="cannot read"):
        parse(["--config", str(tmp_path / "absent.toml")])
