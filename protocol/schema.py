"""Field checkers: every value that arrives from the network passes one.

A message is a dataclass whose fields carry a checker in their metadata
(``field(metadata=check(Int(0, 10)))``). ``from_wire`` walks the decoded
msgpack object, checks every field's type and bounds, and builds the
dataclass; anything else raises ``DecodeError`` naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, TypeVar

from protocol.errors import DecodeError

T = TypeVar("T")


class Checker:
    """Checks one decoded value and returns it in its Python form."""

    # Scalars are their own wire form: lists of them skip per-item to_wire.
    scalar = True

    def check(self, value: Any, where: str) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def to_wire(self, value: Any) -> Any:
        return value

    def check_all(self, values: list, where: str) -> tuple[Any, ...]:
        """``check`` of each item of ``values``, an item's error naming its index."""
        # Rollouts carry thousands of token ids and log-probs: check them
        # without building a location string per item, and only on failure
        # go through again to name the offending one.
        check = self.check
        try:
            return tuple([check(v, where) for v in values])
        except DecodeError:
            for i, v in enumerate(values):
                check(v, f"{where}[{i}]")
            raise


@dataclasses.dataclass(frozen=True)
class Int(Checker):
    lo: int
    hi: int

    def check(self, value: Any, where: str) -> int:
        # bool is an int subclass in Python; on the wire it is a different type.
        if type(value) is not int:
            raise DecodeError(f"{where}: expected int, got {type(value).__name__}")
        if not self.lo <= value <= self.hi:
            raise DecodeError(f"{where}: {value} outside [{self.lo}, {self.hi}]")
        return value

    def check_all(self, values: list, where: str) -> tuple[Any, ...]:
        # Token ids, in C loops (the learner decodes every batch); anything
        # odd goes item by item, for the error that names it.
        if not values or (set(map(type, values)) == {int} and self.lo <= min(values) and max(values) <= self.hi):
            return tuple(values)
        return super().check_all(values, where)


@dataclasses.dataclass(frozen=True)
class Bool(Checker):
    def check(self, value: Any, where: str) -> bool:
        if type(value) is not bool:
            raise DecodeError(f"{where}: expected bool, got {type(value).__name__}")
        return value


@dataclasses.dataclass(frozen=True)
class Float(Checker):
    lo: float
    hi: float

    def check(self, value: Any, where: str) -> float:
        if type(value) is int:
            value = float(value)
        if type(value) is not float:
            raise DecodeError(f"{where}: expected float, got {type(value).__name__}")
        if not math.isfinite(value) or not self.lo <= value <= self.hi:
            raise DecodeError(f"{where}: {value} outside [{self.lo}, {self.hi}]")
        return value

    def check_all(self, values: list, where: str) -> tuple[Any, ...]:
        # Log-probs, in C loops, as Int's; ints among them (turned into floats) go item by item.
        if not values or (
            set(map(type, values)) == {float}
            and all(map(math.isfinite, values))
            and self.lo <= min(values)
            and max(values) <= self.hi
        ):
            return tuple(values)
        return super().check_all(values, where)


@dataclasses.dataclass(frozen=True)
class Str(Checker):
    max_len: int
    choices: tuple[str, ...] = ()

    def check(self, value: Any, where: str) -> str:
        if type(value) is not str:
            raise DecodeError(f"{where}: expected str, got {type(value).__name__}")
        if len(value) > self.max_len:
            raise DecodeError(f"{where}: string longer than {self.max_len}")
        if self.choices and value not in self.choices:
            raise DecodeError(f"{where}: {value!r} not one of {self.choices}")
        return value


@dataclasses.dataclass(frozen=True)
class Bytes(Checker):
    min_len: int
    max_len: int

    def check(self, value: Any, where: str) -> bytes:
        if type(value) is not bytes:
            raise DecodeError(f"{where}: expected bytes, got {type(value).__name__}")
        if not self.min_len <= len(value) <= self.max_len:
            raise DecodeError(f"{where}: length {len(value)} outside [{self.min_len}, {self.max_len}]")
        return value


@dataclasses.dataclass(frozen=True)
class ListOf(Checker):
    item: Checker
    max_len: int
    min_len: int = 0
    scalar = False

    def check(self, value: Any, where: str) -> tuple[Any, ...]:
        if type(value) is not list:
            raise DecodeError(f"{where}: expected list, got {type(value).__name__}")
        if not self.min_len <= len(value) <= self.max_len:
            raise DecodeError(f"{where}: {len(value)} items outside [{self.min_len}, {self.max_len}]")
        return self.item.check_all(value, where)

    def to_wire(self, value: Any) -> Any:
        if self.item.scalar:
            return list(value)
        return [self.item.to_wire(v) for v in value]


@dataclasses.dataclass(frozen=True)
class Nested(Checker):
    cls: type
    scalar = False

    def check(self, value: Any, where: str) -> Any:
        return from_wire(self.cls, value, where)

    def to_wire(self, value: Any) -> Any:
        return to_wire(value)


def check(checker: Checker) -> dict[str, Checker]:
    """Field metadata carrying a checker: ``field(metadata=check(Int(0, 9)))``."""
    return {"check": checker}


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Checker], ...]:
    return tuple((f.name, f.metadata["check"]) for f in dataclasses.fields(cls))


def to_wire(msg: Any) -> dict[str, Any]:
    """A message as a plain dict of msgpack-able values, in field order."""
    return {name: c.to_wire(getattr(msg, name)) for name, c in _fields(type(msg))}


def from_wire(cls: type[T], obj: Any, where: str = "") -> T:
    """Build ``cls`` from a decoded msgpack map, checking every field.

    Unknown keys and missing keys are both errors: a peer speaking a different
    schema version must be told so, not half-understood.
    """
    where = where or cls.__name__
    if type(obj) is not dict:
        raise DecodeError(f"{where}: expected map, got {type(obj).__name__}")
    fields = _fields(cls)
    names = {name for name, _ in fields}
    extra = set(obj) - names
    if extra:
        raise DecodeError(f"{where}: unknown fields {sorted(map(str, extra))}")
    missing = names - set(obj)
    if missing:
        raise DecodeError(f"{where}: missing fields {sorted(missing)}")
    values = {name: c.check(obj[name], f"{where}.{name}") for name, c in fields}
    return cls(**values)
