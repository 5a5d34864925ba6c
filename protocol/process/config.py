"""Typed configuration from CLI flags, environment variables and a TOML file.

Each command's settings are one dataclass. Every field has a default, a help
text and optional bounds in its metadata:

    steps: int = setting(200, "training steps before the learner stops", lo=1)

``add_arguments`` turns the fields into ``--flags``; ``resolve`` picks each
value from, in order: the flag, the env var ``<PREFIX>_<FIELD>``, the TOML
file given with ``--config``, the default. Values are checked against their
bounds and a bad one raises ``ConfigError`` with a one-line message.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tomllib
from pathlib import Path
from typing import Any, NoReturn, TypeVar, get_type_hints

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting that is missing, malformed or out of bounds."""


def setting(
    default: Any,
    help: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    choices: tuple[str, ...] = (),
    flag: str | None = None,
) -> Any:
    meta = {"help": help, "lo": lo, "hi": hi, "choices": choices, "flag": flag}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one flag per field of ``cls``; unset flags stay ``None``."""
    hints = get_type_hints(cls)
    own = cls.__dict__.get("__annotations__", {})
    # A command's own settings first, the ones it shares (base classes) after.
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.name not in own):
        kind = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = f"{f.metadata['help']} (default: {default})"
        if kind is bool:
            parser.add_argument(
                _flag(f),
                dest=f.name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=help_text,
            )
        elif kind == list[str]:
            parser.add_argument(
                _flag(f),
                dest=f.name,
                default=None,
                action="append",
                metavar="VALUE",
                help=help_text + "; repeat the flag for several",
            )
        else:
            parser.add_argument(
                _flag(f),
                dest=f.name,
                default=None,
                metavar=f.name.upper(),
                help=help_text,
                choices=f.metadata["choices"] or None,
            )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML file with settings (flags and env vars override it)",
    )


def _convert(name: str, kind: Any, raw: Any) -> Any:
    try:
        if kind is bool:
            if isinstance(raw, str):
                if raw.lower() in ("1", "true", "yes", "on"):
                    return True
                if raw.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(raw)
            return bool(raw)
        if kind == list[str]:
            if isinstance(raw, str):
                return [p for p in raw.split(",") if p]
            return [str(v) for v in raw]
        if kind is Path:
            return Path(raw).expanduser()
        if kind is int and isinstance(raw, float):
            raise ValueError(raw)
        return kind(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {raw!r} is not a valid {getattr(kind, '__name__', kind)}") from None


def resolve(cls: type[T], args: argparse.Namespace, env_prefix: str) -> T:
    """Build ``cls`` from parsed flags, env vars and the ``--config`` TOML file."""
    file_values: dict[str, Any] = {}
    config_path = getattr(args, "config", None)
    if config_path is not None:
        try:
            file_values = tomllib.loads(Path(config_path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_path} is not valid TOML: {exc}") from None
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(file_values) - known
    if unknown:
        raise ConfigError(f"config file {config_path}: unknown settings {sorted(unknown)}")
    values = {}
    for f in dataclasses.fields(cls):
        env_name = f"{env_prefix}_{f.name.upper()}"
        raw = getattr(args, f.name, None)
        if raw is None:
            raw = os.environ.get(env_name)
        if raw is None:
            raw = file_values.get(f.name)
        if raw is None:
            continue
        value = _convert(_flag(f), hints[f.name], raw)
        lo, hi, choices = f.metadata["lo"], f.metadata["hi"], f.metadata["choices"]
        if lo is not None and value < lo or hi is not None and value > hi:
            raise ConfigError(f"{_flag(f)}: {value} outside [{lo}, {hi}]")
        if choices and value not in choices:
            raise ConfigError(f"{_flag(f)}: {value!r} not one of {', '.join(choices)}")
        values[f.name] = value
    return cls(**values)


def as_dict(config: Any) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(config).items()}


class Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments in one line instead of a usage dump."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def fail(prog: str, message: str) -> NoReturn:
    """Exit with a one-line error, the way every Echo Swarm command reports misuse."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(2)


def resolve_or_exit(prog: str, cls: type[T], args: argparse.Namespace, env_prefix: str) -> T:
    """``resolve``, reporting a bad setting in one line and exiting 2."""
    try:
        return resolve(cls, args, env_prefix)
    except ConfigError as exc:
        fail(prog, str(exc))
