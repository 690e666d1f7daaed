"""The fuzzing property itself fails where it must: a foreign exception, a blow-up."""

from __future__ import annotations

import pytest
from fuzzing import bounded


class OwnError(Exception):
    pass


def test_returns_the_value_or_none_for_an_allowed_error() -> None:
    assert bounded(lambda: 7, OwnError) == 7

    def refuse() -> None:
        raise OwnError("no")

    assert bounded(refuse, OwnError) is None


def test_a_foreign_exception_propagates() -> None:
    with pytest.raises(KeyError):
        bounded(lambda: {}["x"], OwnError)


def test_a_blow_up_fails() -> None:
    with pytest.raises(AssertionError, match="MiB at its peak"):
        bounded(lambda: len(bytearray(8 * 2**20)), OwnError, max_mib=4)
