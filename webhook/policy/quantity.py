"""Kubernetes resource quantities ("1", 1, 1.0, "2e0", "500m", "1Ki") as exact numbers.

Mirrors apimachinery's `resource.ParseQuantity`: a signed decimal number followed by a binary-SI suffix
(Ki..Ei), a decimal-SI suffix (m, "", k, M, G, T, P, E) or a decimal exponent (e3, E-2). JSON numbers are
accepted as the API server accepts them (it strips surrounding quotes if present). Values are exact
`Fraction`s, so `"1500m"` is 3/2 and never a float that happens to round to an integer.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from functools import lru_cache

_NUMBER = re.compile(r"^([+-]?)([0-9]+\.?[0-9]*|\.[0-9]+)(.*)$")  # ASCII digits only, as Kubernetes
_EXPONENT = re.compile(r"^[eE]([+-]?[0-9]+)$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# Exponents beyond this are refused instead of building enormous integers from a hostile "1e999999999".
_MAX_EXPONENT = 30
_MAX_LENGTH = 64


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message says why."""


def parse(value: object) -> Fraction:
    """The exact value of a quantity given as a JSON string or number; raises QuantityError."""
    if isinstance(value, bool) or value is None:
        raise QuantityError(f"{display(value)} is not a quantity: write a number such as 1")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{display(value)} is not a quantity: write a number such as 1")
        return _round_up_nano(Fraction(repr(value)))
    if not isinstance(value, str):
        raise QuantityError(f"{display(value)} is not a quantity: write a number such as 1")
    return _parse_text(value.strip())


def count(value: object) -> int | Fraction:
    """`parse`, with a whole value as an int (a GPU count, the common case), memoised for strings."""
    if isinstance(value, str):
        return _count_text(value.strip())
    exact = parse(value)
    return exact.numerator if exact.denominator == 1 else exact


@lru_cache(maxsize=1024)
def _count_text(text: str) -> int | Fraction:
    exact = _parse_text(text)
    return exact.numerator if exact.denominator == 1 else exact


@lru_cache(maxsize=1024)
def _parse_text(text: str) -> Fraction:
    if len(text) > _MAX_LENGTH:
        raise QuantityError(f'"{text[:20]}..." is too long to be a quantity: write a number such as 1')
    match = _NUMBER.match(text)
    if not match:
        raise QuantityError(f'"{text}" is not a quantity: write a number such as 1 (suffixes: m, k, Ki, e3)')
    sign, digits, suffix = match.groups()
    number = Fraction(digits if not digits.endswith(".") else digits[:-1])
    if sign == "-":
        number = -number
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return _round_up_nano(number * _DECIMAL[suffix])
    exponent = _EXPONENT.match(suffix)
    if exponent:
        power = int(exponent.group(1))
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(f'"{text}" is out of range: the exponent must be between -30 and 30')
        return _round_up_nano(number * Fraction(10) ** power)
    raise QuantityError(f'"{text}" has an unknown suffix "{suffix}": use m, k, M, G, Ki, Mi, Gi or e<n>')


def _round_up_nano(value: Fraction) -> Fraction:
    """Kubernetes rounds every parsed value up (away from zero) to a whole nano-unit."""
    scaled = value * 10**9
    if scaled.denominator == 1:
        return value
    whole = -((-scaled.numerator) // scaled.denominator) if value > 0 else scaled.numerator // scaled.denominator
    return Fraction(whole, 10**9)


def display(value: object) -> str:
    """The value as a person wrote it, for messages ("500m", "2"); never the repr of a nested structure.

    A hostile value can be nested a thousand levels deep; printing it would overflow the interpreter's stack.
    """
    if isinstance(value, str):
        return value if len(value) <= _MAX_LENGTH else value[:20] + "..."
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    return f"a {'mapping' if isinstance(value, dict) else type(value).__name__}"
