"""DRA device selectors: which devices a DeviceClass's and a request's CEL selectors select, evaluated as the
scheduler's allocator evaluates them.

A `DeviceQuery` is the selectors of one question, in order (the class's first, then the request's). A device is
selected when every selector is true; the allocator stops at the first false one, and a runtime error on a device
fails the claim's allocation, so here a device is then *undecided* (`None`): the question has no answer, and the
webhook never denies on it.

Two ways of evaluating one selector:

- the forms the webhook generates (`device.driver == "..."`, `device.attributes["<domain>"].<name> == "..."` and
  `....<name>.lowerAscii().contains("...")`, ANDed) are read into `Condition`s and evaluated without CEL;
- any other expression is compiled once (`compiled`, a bounded cache keyed by the text) and evaluated by CEL, with
  the environment Kubernetes gives DRA selectors (k8s.io/dynamic-resource-allocation/cel/compile.go):
  `device.driver`; `device.attributes["<domain>"].<name>` (int, bool, string, or a semver for a `version`);
  `device.capacity["<domain>"].<name>` (a quantity); an unknown domain is an empty map; Kubernetes' quantity
  library (`quantity`, `isQuantity`, `compareTo`, `isGreaterThan`, `isLessThan`, `asInteger`, `asApproximateFloat`,
  `sign`, `add`, `sub`, `isInteger`), its semver library (`semver`, `isSemver`, `compareTo`, `isGreaterThan`,
  `isLessThan`, `major`, `minor`, `patch`), the string extensions (`lowerAscii`, `upperAscii`, `split`, `trim`,
  `replace`, `indexOf`, `lastIndexOf`, `substring`, `charAt`, `join`) and `cel.bind`.

The CEL library is `common-expression-language` (the Rust `cel` crate with Python bindings), chosen over the pure
Python `cel-python`: about 26 µs per evaluation against about 330 µs, regular expressions with RE2's semantics (as
cel-go), and cel-go's heterogeneous equality and commutative `&&`/`||` error absorption. What it lacks is added here:
it carries no opaque values, so a quantity is the map `{"@quantity": "<exact value>"}` and a semver the map
`{"@semver": "<major.minor.patch[-pre]>"}` (equal when the values are equal, as Kubernetes'); `cel.bind(v, init,
body)` is rewritten to the equivalent comprehension `[init].map(v, body)[0]`; the unknown domains an expression
names (`attributes["x.com"]`) are given as empty maps. Exact quantities come from `webhook.policy.quantity`, semver
from the `semver` package (2.0 rules, as blang/semver).

An expression that does not compile, or fails on a device (an unknown function, a missing attribute, a wrong type),
or is not a bool, makes no decision; it is logged once, with the library's error.

Each selector's verdicts are cached by the device's projection onto what the expression can reach (the driver,
and the attributes and capacities it names when it only reads them by name), so a fleet of identical GPUs costs one
evaluation per product, not one per device.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any, Literal

import cel
import semver
from cel import stdlib

from webhook.policy import quantity

_LOG = logging.getLogger("webhook.policy.device_selectors")

Op = Literal["==", "contains"]
Verdict = bool | None  # None: undecided (a CEL runtime error, as the allocator meets it)
MAX_EXPRESSION = 10 * 1024  # Kubernetes refuses longer selectors
COMPILED = 512  # expressions kept compiled
VERDICTS = 4096  # device projections remembered per expression


# --------------------------------------------------------------------------------------------- devices


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a ResourceSlice: its attributes as (qualified name, type, value as text), in name order, and
    its capacities as (qualified name, quantity text). An unqualified name is in the driver's domain."""

    name: str
    attributes: tuple[tuple[str, str, str], ...] = ()
    capacity: tuple[tuple[str, str], ...] = ()

    def attribute(self, name: str) -> tuple[str, str] | None:
        """(type, value) of an attribute, or None."""
        return next(((kind, value) for key, kind, value in self.attributes if key == name), None)


def all_of(verdicts: Iterable[Verdict]) -> Verdict:
    """CEL's `&&` over any number of terms: false if any is false, else undecided if any is, else true."""
    undecided = False
    for verdict in verdicts:
        if verdict is False:
            return False
        undecided = undecided or verdict is None
    return None if undecided else True


# --------------------------------------------------------------------------------------------- the generated forms


@dataclass(frozen=True, slots=True, order=True)
class Condition:
    """One term of a generated selector: `attribute` "" is the driver; `contains` is
    `lowerAscii().contains(value)`."""

    attribute: str
    op: Op
    value: str

    def holds(self, driver: str, device: Device) -> Verdict:
        """As CEL here: a missing attribute is an error (undecided); a string compared with another type is false;
        `lowerAscii()` of anything but a string an error."""
        if not self.attribute:
            return driver == self.value
        found = device.attribute(self.attribute)
        if found is None:
            return None
        kind, text = found
        if kind != "string":  # an int, a bool or a semver equals no string; a semver has no lowerAscii()
            return False if self.op == "==" else None
        return text == self.value if self.op == "==" else self.value in text.lower()


_Q = r"""(["'])([^"'\\]*)\{n}"""
_TERMS = (
    re.compile(r"device\.driver\s*==\s*" + _Q.format(n=1)),
    re.compile(r"""device\.attributes\[(["'])([^"'\\]+)\1\]\.([A-Za-z_][A-Za-z0-9_]*)\s*==\s*""" + _Q.format(n=4)),
    re.compile(r"""device\.attributes\[(["'])([^"'\\]+)\1\]\.([A-Za-z_][A-Za-z0-9_]*)\.lowerAscii\(\)\.contains\("""
               + _Q.format(n=4) + r"\)"),
)


def _condition(term: str) -> Condition | None:
    term = term.strip()
    while term.startswith("(") and term.endswith(")"):
        term = term[1:-1].strip()
    for number, pattern in enumerate(_TERMS):
        match = pattern.fullmatch(term)
        if match is None:
            continue
        if number == 0:
            return Condition("", "==", match.group(2))
        attribute = f"{match.group(2)}/{match.group(3)}"
        return Condition(attribute, "==", match.group(5)) if number == 1 else \
            Condition(attribute, "contains", match.group(5))
    return None


def generated_terms(expression: str) -> tuple[Condition, ...] | None:
    """The terms of an expression in the generated forms (ANDed), or None when any term is another form."""
    terms = tuple(_condition(term) for term in expression.split("&&"))
    return None if any(t is None for t in terms) else tuple(t for t in terms if t is not None)


# --------------------------------------------------------------------------------------------- CEL: values


QUANTITY, SEMVER = "@quantity", "@semver"
CelMap = dict[str, Any]


def _quantity(value: Fraction) -> CelMap:
    return {QUANTITY: str(value)}


def _semver(version: semver.Version) -> CelMap:
    return {SEMVER: str(version.replace(build=None))}


def _as_quantity(value: Any) -> Fraction:
    if isinstance(value, dict) and isinstance(value.get(QUANTITY), str):
        return Fraction(value[QUANTITY])
    if isinstance(value, int) and not isinstance(value, bool):
        return Fraction(value)
    raise TypeError(f"{value!r} is not a quantity: make one with quantity(\"...\")")


def _as_version(value: Any) -> semver.Version:
    if isinstance(value, dict) and isinstance(value.get(SEMVER), str):
        return semver.Version.parse(value[SEMVER])
    raise TypeError(f"{value!r} is not a semver: make one with semver(\"...\")")


def _normalized(text: str) -> str:
    """Kubernetes' `semver(text, true)`: a leading "v" dropped, missing minor and patch as 0, no leading zeros."""
    core, sep, rest = text.removeprefix("v").partition("-")
    if not sep:
        core, sep, rest = core.partition("+")
    parts = [*core.split("."), "0", "0"][:3] if core.count(".") < 2 else core.split(".")
    return ".".join(p.lstrip("0") or "0" for p in parts) + sep + rest


def _parse_semver(text: Any, normalize: bool = False) -> CelMap:
    if not isinstance(text, str):
        raise TypeError(f"semver() takes a string, not {text!r}")
    return _semver(semver.Version.parse(_normalized(text) if normalize else text))


def _is_semver(text: Any, normalize: bool = False) -> bool:
    try:
        _parse_semver(text, normalize)
    except (TypeError, ValueError):
        return False
    return True


def _parse_quantity(text: Any) -> CelMap:
    if not isinstance(text, str):
        raise TypeError(f"quantity() takes a string, not {text!r}")
    return _quantity(quantity.parse(text))


def _is_quantity(text: Any) -> bool:
    try:
        _parse_quantity(text)
    except (TypeError, ValueError):
        return False
    return True


def _compare(left: Any, right: Any) -> int:
    """compareTo for two quantities or two semvers: -1, 0 or 1."""
    if isinstance(left, dict) and SEMVER in left:
        return _as_version(left).compare(_as_version(right))
    a, b = _as_quantity(left), _as_quantity(right)
    return (a > b) - (a < b)


def _as_integer(value: Any) -> int:
    exact = _as_quantity(value)
    if exact.denominator != 1 or not -(2**63) <= exact.numerator < 2**63:
        raise ValueError(f"quantity {exact} is not an int64: test isInteger() first")
    return exact.numerator


def _sign(value: Any) -> int:
    exact = _as_quantity(value)
    return (exact > 0) - (exact < 0)


def _is_integer(value: Any) -> bool:
    exact = _as_quantity(value)
    return exact.denominator == 1 and -(2**63) <= exact.numerator < 2**63


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _parse_quantity,
    "isQuantity": _is_quantity,
    "semver": _parse_semver,
    "isSemver": _is_semver,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: _compare(a, b) > 0,
    "isLessThan": lambda a, b: _compare(a, b) < 0,
    "sign": _sign,
    "isInteger": _is_integer,
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: float(_as_quantity(q)),
    "add": lambda a, b: _quantity(_as_quantity(a) + _as_quantity(b)),
    "sub": lambda a, b: _quantity(_as_quantity(a) - _as_quantity(b)),
    "major": lambda v: _as_version(v).major,
    "minor": lambda v: _as_version(v).minor,
    "patch": lambda v: _as_version(v).patch,
}

_contexts = threading.local()


def _context() -> cel.Context:
    """This thread's CEL context: the functions registered once; `device` is set per evaluation."""
    context: cel.Context | None = getattr(_contexts, "context", None)
    if context is None:
        context = cel.Context()
        stdlib.add_stdlib_to_context(context, ["strings"])
        for name, function in FUNCTIONS.items():
            context.add_function(name, function)
        _contexts.context = context
    return context


def _value(kind: str, text: str) -> Any:
    if kind == "int":
        return int(text)
    if kind == "bool":
        return text == "true"
    if kind == "version":
        return _semver(semver.Version.parse(text))
    return text


def activation(driver: str, attributes: Iterable[tuple[str, str, str]], capacity: Iterable[tuple[str, str]],
               domains: Iterable[str] = ()) -> CelMap:
    """`device` as CEL sees it; `domains` (the ones an expression names) are empty maps when the device has none.
    A value that does not parse (an invalid version or quantity, which the API server refuses) is left out, so
    reading it is an error."""
    found: dict[str, CelMap] = {d: {} for d in domains}
    room: dict[str, CelMap] = {d: {} for d in domains}
    for key, kind, text in attributes:
        domain, _, name = key.partition("/")
        try:
            found.setdefault(domain, {})[name] = _value(kind, text)
        except ValueError:
            continue
    for key, text in capacity:
        domain, _, name = key.partition("/")
        try:
            room.setdefault(domain, {})[name] = _quantity(quantity.parse(text))
        except ValueError:
            continue
    return {"driver": driver, "attributes": found, "capacity": room}


# --------------------------------------------------------------------------------------------- CEL: expressions

_TOKEN = re.compile(r"""\s+|(?P<string>[rRbB]{0,2}(?:'''|\"\"\"|'|"))|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)"""
                    r"""|(?P<number>[0-9][A-Za-z0-9_.]*)|(?P<op>&&|\|\||==|!=|<=|>=|.)""", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Token:
    kind: Literal["string", "ident", "number", "op"]
    text: str
    start: int
    end: int
    value: str | None = None  # a string literal's value, None when it has escapes


def tokens(expression: str) -> list[Token]:
    """The expression's tokens (enough to rewrite `cel.bind` and to see what the expression names); raises
    ValueError on an unterminated string."""
    found: list[Token] = []
    at = 0
    while at < len(expression):
        match = _TOKEN.match(expression, at)
        assert match is not None  # the last alternative matches any character
        if match.group("string"):
            prefix = match.group("string")
            quote = prefix.lstrip("rRbB")
            raw = "r" in prefix.lower()
            at = end = match.end()
            while True:
                end = expression.find(quote, end)
                if end < 0:
                    raise ValueError(f"unterminated string at {match.start()}")
                backslashes = len(expression[:end]) - len(expression[:end].rstrip("\\"))
                if raw or backslashes % 2 == 0:
                    break
                end += 1
            body = expression[at:end]
            found.append(Token("string", expression[match.start():end + len(quote)], match.start(),
                               end + len(quote), body if raw or "\\" not in body else None))
            at = end + len(quote)
            continue
        kind = match.lastgroup
        if kind is not None:
            found.append(Token(kind, match.group(), match.start(), match.end()))  # type: ignore[arg-type]
        at = match.end()
    return found


def rewrite_bind(expression: str) -> str:
    """`cel.bind(v, init, body)` as `[init].map(v, body)[0]`, which binds `v` the same way (nested ones too)."""
    while True:
        found = tokens(expression)
        start = next((i for i in range(len(found) - 3)
                      if [t.text for t in found[i:i + 4]] == ["cel", ".", "bind", "("]
                      and (i == 0 or found[i - 1].text != ".")), None)
        if start is None:
            return expression
        depth, commas, close = 0, list[int](), -1
        for i in range(start + 3, len(found)):
            text = found[i].text if found[i].kind == "op" else ""
            depth += text in "([{" and text != ""
            depth -= text in ")]}" and text != ""
            if depth == 1 and text == ",":
                commas.append(i)
            if depth == 0:
                close = i
                break
        if close < 0 or len(commas) != 2:
            raise ValueError("cel.bind takes three arguments: cel.bind(name, init, body)")
        name = expression[found[start + 3].end:found[commas[0]].start].strip()
        init = expression[found[commas[0]].end:found[commas[1]].start]
        body = expression[found[commas[1]].end:found[close].start]
        expression = (expression[:found[start].start] + f"[{init.strip()}].map({name},{body})[0]"
                      + expression[found[close].end:])


_UNKNOWN = object()
_READ_BY_NAME = ("[", "string", "]", ".", "ident")


@dataclass(frozen=True, slots=True)
class Reach:
    """What an expression can read of a device: the domains it names (`attributes["<domain>"]`) and, when it reads
    attributes and capacities only by name (`attributes["<domain>"].<name>`, not a function of the map), the
    qualified names it can read; None: anything (it iterates, compares or passes a whole map)."""

    domains: frozenset[str]
    names: frozenset[str] | None


def reach(found: list[Token]) -> Reach:
    domains: set[str] = set()
    by_name = True
    words = {t.value if t.kind == "string" else t.text for t in found if t.kind in ("string", "ident")} - {None}
    for i, token in enumerate(found):
        if token.kind != "ident":
            continue
        if token.text == "device" and (i + 2 >= len(found) or found[i + 1].text != "."
                                       or found[i + 2].text not in ("driver", "attributes", "capacity")):
            by_name = False
        if token.text in ("attributes", "capacity") and i and found[i - 1].text == ".":
            following = found[i + 1:i + 7]
            shape = [t.kind if t.kind in ("string", "ident") else t.text for t in following]
            if len(following) >= 3 and shape[:3] == ["[", "string", "]"] and following[1].value is not None:
                domains.add(following[1].value)
            if shape[:5] != list(_READ_BY_NAME) or following[1].value is None or shape[5:] == ["("]:
                by_name = False
    names = frozenset(f"{d}/{w}" for d in domains for w in words if w) if by_name else None
    return Reach(frozenset(domains), names)


@dataclass(slots=True)
class Compiled:
    """One expression, compiled once: its program (None when it does not compile, `error` says why), what it can
    read of a device, and its verdicts by device projection."""

    expression: str
    program: cel.Program | None
    error: str = ""
    reach: Reach = field(default_factory=lambda: Reach(frozenset(), None))
    verdicts: dict[Hashable, Verdict] = field(default_factory=dict)
    reported: bool = False

    def verdict(self, driver: str, device: Device) -> Verdict:
        if self.program is None:
            return None
        names = self.reach.names
        if names is None:
            attributes, capacity = device.attributes, device.capacity
        else:
            attributes = tuple(a for a in device.attributes if a[0] in names)
            capacity = tuple(c for c in device.capacity if c[0] in names)
        key = (driver, attributes, capacity)
        known = self.verdicts.get(key, _UNKNOWN)
        if known is not _UNKNOWN:
            return known  # type: ignore[return-value]
        verdict = self._evaluate(driver, device.name, activation(driver, attributes, capacity, self.reach.domains))
        if len(self.verdicts) >= VERDICTS:
            self.verdicts.clear()
        self.verdicts[key] = verdict
        return verdict

    def _evaluate(self, driver: str, name: str, device: CelMap) -> Verdict:
        assert self.program is not None
        context = _context()
        context.add_variable("device", device)
        try:
            result = self.program.execute(context)
        except Exception as error:  # the library raises ValueError, TypeError, KeyError, RuntimeError...
            self._report(f"fails on device {name!r} of driver {driver!r}: {type(error).__name__}: {error}")
            return None
        if not isinstance(result, bool):
            self._report(f"gives {type(result).__name__} {result!r} on device {name!r} of driver {driver!r}, "
                         "not a bool")
            return None
        return result

    def _report(self, what: str) -> None:
        if not self.reported:
            self.reported = True
            _LOG.warning("DRA CEL selector %r %s; the webhook makes no decision on the devices it selects (the "
                         "scheduler fails the allocation of claims that use it too): fix the selector in its "
                         "DeviceClass or ResourceClaim, e.g. test an attribute with `has()` or `in` before reading it",
                         self.expression, what)


def _compile_program(expression: str) -> cel.Program:
    """The library's compile, of the expression with `cel.bind` rewritten (a seam for the tests)."""
    return cel.compile(rewrite_bind(expression))


@lru_cache(maxsize=COMPILED)
def compiled(expression: str) -> Compiled:
    """The expression compiled, once while it stays among the last `COMPILED` ones asked."""
    try:
        if len(expression) > MAX_EXPRESSION:
            raise ValueError(f"it is {len(expression)} characters long, more than Kubernetes' {MAX_EXPRESSION}")
        return Compiled(expression, _compile_program(expression), reach=reach(tokens(expression)))
    except Exception as error:  # the library raises ValueError on a syntax error; tokens() too
        _LOG.warning("DRA CEL selector %r does not compile (%s: %s); the webhook makes no decision on the devices "
                     "it selects (the API server refuses it in a new object): fix the selector in its DeviceClass "
                     "or ResourceClaim", expression, type(error).__name__, error)
        return Compiled(expression, None, f"{type(error).__name__}: {error}")


# --------------------------------------------------------------------------------------------- questions


@dataclass(frozen=True, slots=True)
class Selector:
    """One CEL selector: its terms when it is in the generated forms (evaluated without CEL), else evaluated by
    CEL."""

    expression: str
    terms: tuple[Condition, ...] | None

    def verdict(self, driver: str, device: Device) -> Verdict:
        if self.terms is not None:
            return all_of(t.holds(driver, device) for t in self.terms)
        return compiled(self.expression).verdict(driver, device)


@dataclass(frozen=True, slots=True)
class DeviceQuery:
    """The devices that satisfy every selector, in order; keyed by value (the same selectors are one question)."""

    selectors: tuple[Selector, ...]

    @classmethod
    def of(cls, expressions: Iterable[str]) -> DeviceQuery | None:
        """The query of CEL selectors, ANDed in order; None when one does not compile (logged once)."""
        selectors = tuple(Selector(e, generated_terms(e)) for e in dict.fromkeys(expressions))
        if any(s.terms is None and compiled(s.expression).program is None for s in selectors):
            return None
        return cls(selectors)

    @property
    def conditions(self) -> tuple[Condition, ...]:
        """The generated-form terms of all selectors, sorted (what the fast path evaluates)."""
        return tuple(sorted({t for s in self.selectors for t in s.terms or ()}))

    def verdict(self, driver: str, device: Device) -> Verdict:
        """As the allocator: the selectors in order, false at the first false one, undecided at an error."""
        for selector in self.selectors:
            verdict = selector.verdict(driver, device)
            if verdict is not True:
                return verdict
        return True

    def count(self, devices: Iterable[tuple[str, Device]]) -> tuple[int, int]:
        """(devices selected, devices undecided) among (driver, device) pairs."""
        selected = undecided = 0
        for driver, device in devices:
            verdict = self.verdict(driver, device)
            selected += verdict is True
            undecided += verdict is None
        return selected, undecided


@lru_cache(maxsize=1024)
def query_of(expressions: tuple[str, ...]) -> DeviceQuery | None:
    """`DeviceQuery.of`, read once per distinct list of selectors (a review asks the same ones several times)."""
    return DeviceQuery.of(expressions)
