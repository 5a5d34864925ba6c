"""Lists of numbers are checked in C loops (protocol.schema's ``check_all``
fast paths): they must accept and refuse exactly what checking item by
item does, with the same error."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import DecodeError
from protocol.schema import Checker, Float, Int, ListOf


def item_by_item(checker: Checker, values: list, where: str) -> tuple:
    """What the base class does: the reference the fast paths must equal."""
    return Checker.check_all(checker, values, where)


def outcome(fn, *args):  # type: ignore[no-untyped-def]
    try:
        result = fn(*args)
    except DecodeError as exc:
        return ("error", str(exc))
    return ("ok", result, [type(v) for v in result])


ODD = st.one_of(st.booleans(), st.none(), st.text(max_size=2), st.binary(max_size=2))
# Mostly clean lists (the fast path's own verdict), some with one odd item.
INTS = st.one_of(
    st.lists(st.integers(-10, 300), max_size=40), st.lists(st.one_of(st.integers(-10, 300), ODD), max_size=8)
)
FLOATS = st.one_of(
    st.lists(st.floats(-100, 5), max_size=40),
    st.lists(
        st.one_of(st.floats(-100, 5), st.sampled_from([math.nan, math.inf, -math.inf, -0.0]), st.integers(-3, 3), ODD),
        max_size=8,
    ),
)


@given(INTS)
def test_a_token_list_is_checked_as_item_by_item(values: list) -> None:
    checker = Int(0, 255)
    assert outcome(checker.check_all, values, "m.tokens") == outcome(item_by_item, checker, values, "m.tokens")


@given(FLOATS)
def test_a_logprob_list_is_checked_as_item_by_item(values: list) -> None:
    checker = Float(-50.0, 0.0)
    fast, slow = outcome(checker.check_all, values, "m.logprobs"), outcome(item_by_item, checker, values, "m.logprobs")
    if fast[0] == "ok" and slow[0] == "ok":  # equal as floats (NaN is refused by both)
        assert fast[2] == slow[2] == [float] * len(values)
        assert all(math.isclose(a, b) or a == b for a, b in zip(fast[1], slow[1]))
    else:
        assert fast == slow


def test_the_error_names_the_offending_item() -> None:
    with pytest.raises(DecodeError, match=r"m\.tokens\[2\]: 999 outside \[0, 255\]"):
        ListOf(Int(0, 255), max_len=10).check([1, 2, 999], "m.tokens")
    with pytest.raises(DecodeError, match=r"m\.logprobs\[1\]: expected float, got bool"):
        ListOf(Float(-50.0, 0.0), max_len=10).check([-1.0, True], "m.logprobs")
    with pytest.raises(DecodeError, match=r"m\.logprobs\[0\]: nan outside"):
        ListOf(Float(-50.0, 0.0), max_len=10).check([math.nan], "m.logprobs")
