"""Kubernetes quantities as the API server parses them (contract 3.4): every form, exact values, and
refusals that are always a QuantityError (never another exception, never slow)."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.policy import quantity
from webhook.policy.quantity import QuantityError

VALID = [
    # contract 3.4, row by row
    pytest.param(1, Fraction(1), id="json-int-1"),
    pytest.param("1", Fraction(1), id="str-1"),
    pytest.param("+1", Fraction(1), id="plus-1"),
    pytest.param(" 1 ", Fraction(1), id="spaces-around-1"),
    pytest.param("\t1\n", Fraction(1), id="tab-newline-around-1"),
    pytest.param("2e0", Fraction(2), id="exp-2e0"),
    pytest.param("2E0", Fraction(2), id="exp-2E0"),
    pytest.param("0.002k", Fraction(2), id="0.002k"),
    pytest.param("1e3", Fraction(1000), id="exp-1e3"),
    pytest.param("1.5", Fraction(3, 2), id="str-1.5"),
    pytest.param(1.5, Fraction(3, 2), id="json-float-1.5"),
    pytest.param("1500m", Fraction(3, 2), id="1500m"),
    pytest.param("500m", Fraction(1, 2), id="500m"),
    pytest.param("0.5", Fraction(1, 2), id="str-0.5"),
    pytest.param("0.0001", Fraction(1, 10_000), id="0.0001-not-whole"),
    pytest.param("0", Fraction(0), id="zero"),
    pytest.param("1Ki", Fraction(1024), id="1Ki"),
    # more forms
    pytest.param(".5", Fraction(1, 2), id="leading-dot"),
    pytest.param("1.", Fraction(1), id="trailing-dot"),
    pytest.param("1.0", Fraction(1), id="str-1.0"),
    pytest.param(1.0, Fraction(1), id="json-float-1.0"),
    pytest.param(0, Fraction(0), id="json-int-0"),
    pytest.param("-1", Fraction(-1), id="negative-1"),
    pytest.param("-0", Fraction(0), id="negative-zero"),
    pytest.param(-2, Fraction(-2), id="json-negative-int"),
    pytest.param("1000m", Fraction(1), id="1000m"),
    pytest.param("2000m", Fraction(2), id="2000m"),
    pytest.param("1k", Fraction(1000), id="1k"),
    pytest.param("1M", Fraction(10**6), id="1M"),
    pytest.param("1G", Fraction(10**9), id="1G"),
    pytest.param("1T", Fraction(10**12), id="1T"),
    pytest.param("1P", Fraction(10**15), id="1P"),
    pytest.param("1E", Fraction(10**18), id="1E-exa"),
    pytest.param("1Mi", Fraction(2**20), id="1Mi"),
    pytest.param("1Gi", Fraction(2**30), id="1Gi"),
    pytest.param("1Ti", Fraction(2**40), id="1Ti"),
    pytest.param("1Pi", Fraction(2**50), id="1Pi"),
    pytest.param("1Ei", Fraction(2**60), id="1Ei"),
    pytest.param("0.5Ki", Fraction(512), id="0.5Ki"),
    pytest.param("1000000000n", Fraction(1), id="nano-whole"),
    pytest.param("1000000u", Fraction(1), id="micro-whole"),
    pytest.param("1n", Fraction(1, 10**9), id="1n"),
    pytest.param("1u", Fraction(1, 10**6), id="1u"),
    pytest.param("1.5n", Fraction(2, 10**9), id="nano-rounds-up"),
    pytest.param("0.0000000001", Fraction(1, 10**9), id="below-nano-rounds-up"),
    pytest.param("1e-3", Fraction(1, 1000), id="negative-exponent"),
    pytest.param("1e+3", Fraction(1000), id="plus-exponent"),
    pytest.param("1E-2", Fraction(1, 100), id="upper-negative-exponent"),
    pytest.param("1e30", Fraction(10**30), id="exponent-at-limit"),
    pytest.param("0001", Fraction(1), id="leading-zeros"),
    pytest.param("9" * 64, Fraction(int("9" * 64)), id="64-digits"),
    pytest.param(10**30, Fraction(10**30), id="huge-json-int"),
    pytest.param(1e20, Fraction(10**20), id="json-float-1e20"),
    pytest.param(1e-10, Fraction(1, 10**9), id="tiny-json-float-rounds-up"),
]


@pytest.mark.parametrize(("raw", "expected"), VALID)
def test_parse(raw: object, expected: Fraction) -> None:
    assert quantity.parse(raw) == expected


@pytest.mark.parametrize(("raw", "expected"), VALID)
def test_count_is_parse_with_whole_values_as_int(raw: object, expected: Fraction) -> None:
    counted = quantity.count(raw)
    assert counted == expected
    assert isinstance(counted, int) is (expected.denominator == 1)
    assert quantity.count(raw) == counted  # the memoised answer is the same


@pytest.mark.parametrize(("raw", "whole"), [
    pytest.param("1", True, id="1"),
    pytest.param("2e0", True, id="2e0"),
    pytest.param("1Ki", True, id="1Ki"),
    pytest.param("0.002k", True, id="0.002k"),
    pytest.param("500m", False, id="500m"),
    pytest.param("1500m", False, id="1500m"),
    pytest.param("0.0001", False, id="0.0001"),
    pytest.param(1.5, False, id="float-1.5"),
])
def test_whole_numbers_are_exact(raw: object, whole: bool) -> None:
    """Exact fractions: "1500m" is 3/2, never a float that happens to round to 2."""
    assert (quantity.parse(raw).denominator == 1) is whole


INVALID = [
    pytest.param("abc", id="abc"),
    pytest.param("1 GPU", id="with-unit-word"),
    pytest.param("", id="empty"),
    pytest.param("   ", id="blank"),
    pytest.param(".", id="dot"),
    pytest.param("+", id="plus"),
    pytest.param("-", id="minus"),
    pytest.param("e3", id="exponent-only"),
    pytest.param("1e", id="e-without-digits"),
    pytest.param("1ki", id="lowercase-ki"),
    pytest.param("1K", id="uppercase-K"),
    pytest.param("1KiB", id="KiB"),
    pytest.param("1 Ki", id="space-before-suffix"),
    pytest.param("1_000", id="underscore"),
    pytest.param("0x10", id="hex"),
    pytest.param("1/2", id="slash"),
    pytest.param("+-1", id="two-signs"),
    pytest.param("1..0", id="two-dots"),
    pytest.param("1.5.2", id="two-decimal-points"),
    pytest.param("1e3m", id="exponent-and-suffix"),
    pytest.param("Infinity", id="infinity-word"),
    pytest.param("NaN", id="nan-word"),
    pytest.param("inf", id="inf-word"),
    pytest.param(True, id="bool-true"),
    pytest.param(False, id="bool-false"),
    pytest.param(None, id="none"),
    pytest.param([1], id="list"),
    pytest.param({"value": 1}, id="dict"),
    pytest.param(b"1", id="bytes"),
    pytest.param(float("nan"), id="float-nan"),
    pytest.param(float("inf"), id="float-inf"),
    pytest.param(float("-inf"), id="float-minus-inf"),
    pytest.param("1e31", id="exponent-over-limit"),
    pytest.param("1e999999999", id="huge-exponent"),
    pytest.param("1e-999999999", id="huge-negative-exponent"),
    pytest.param("1e" + "9" * 50, id="exponent-with-50-digits"),
    pytest.param("9" * 65, id="65-digits"),
    pytest.param("1" * 1_000_000, id="million-digits"),
    pytest.param("1." + "0" * 1_000_000, id="million-decimals"),
    pytest.param("x" * 1_000_000, id="million-letters"),
]


@pytest.mark.parametrize("raw", INVALID)
def test_refused_with_quantity_error_quickly(raw: object) -> None:
    started = time.perf_counter()
    with pytest.raises(QuantityError) as err:
        quantity.parse(raw)
    assert time.perf_counter() - started < 0.1
    message = str(err.value)
    assert message and len(message) < 200, "the message is for a person: short, never the whole input"


@pytest.mark.parametrize("raw", INVALID)
def test_count_refuses_what_parse_refuses(raw: object) -> None:
    with pytest.raises(QuantityError):
        quantity.count(raw)


def test_quantity_error_is_a_value_error() -> None:
    assert issubclass(QuantityError, ValueError)


@pytest.mark.parametrize("raw", [pytest.param("\u0661", id="arabic-indic-one"),
                                 pytest.param("\uff11", id="fullwidth-one")])
def test_non_ascii_digits_are_refused(raw: str) -> None:
    with pytest.raises(QuantityError):
        quantity.parse(raw)


@pytest.mark.parametrize(("raw", "shown"), [
    pytest.param("500m", "500m", id="string-as-written"),
    pytest.param(1, "1", id="int"),
    pytest.param(1.5, "1.5", id="float"),
])
def test_display(raw: object, shown: str) -> None:
    assert quantity.display(raw) == shown


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(max_size=40),
    st.text(alphabet="0123456789.+-eEkKmMGTPinu ", max_size=30),
    st.from_regex(r"\A[+-]?[0-9]{0,5}(\.[0-9]{0,5})?([eE][+-]?[0-9]{1,4}|Ki|Mi|Gi|m|k|M|G|n|u)?\Z"),
    st.integers(), st.floats(), st.booleans(), st.none(), st.lists(st.integers(), max_size=2),
))
def test_never_another_exception(raw: object) -> None:
    try:
        value = quantity.parse(raw)
    except QuantityError:
        return
    assert isinstance(value, Fraction)
    assert (value * 10**9).denominator == 1, "values are rounded to whole nano-units"
