"""A policy's variables where CEL cannot read them: in a matchCondition.

An admission policy's matchConditions are compiled without the policy's `variables`, so an expression written
against them (`variables.spec`, `variables.gpus`, ...) cannot be one as it is. `bind` rewrites it to evaluate each
variable it reads, and each variable those read, once, in the order the policy defines them, as the single element
of a list comprehension: `[<value>].exists(v_<name>, <the rest>)`. The API server's CEL environment has no
`cel.bind` (the bindings extension is not in k8s.io/apiserver v0.36.3 `pkg/cel/environment/base.go`), so the
comprehension is the binding.

Unlike a policy's variables, which the API server evaluates lazily on first read, these are evaluated before the
expression: every one must be safe (no error, bounded cost) for any object the condition sees.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

PREFIX = "v_"
_READ = re.compile(r"\bvariables\.([A-Za-z_][A-Za-z0-9_]*)")


def reads(expr: str) -> set[str]:
    """The variables `expr` reads directly."""
    return set(_READ.findall(expr))


def needed(expr: str, variables: Sequence[tuple[str, str]]) -> set[str]:
    """The variables `expr` reads, directly or through other variables."""
    defined = dict(variables)
    out: set[str] = set()
    stack = sorted(reads(expr))
    while stack:
        name = stack.pop()
        if name in out:
            continue
        if name not in defined:
            raise ValueError(f"the expression reads variables.{name}, which the policy does not define")
        out.add(name)
        stack.extend(sorted(reads(defined[name])))
    return out


def _renamed(expr: str) -> str:
    return _READ.sub(lambda m: PREFIX + m.group(1), expr)


def bind(expr: str, variables: Sequence[tuple[str, str]]) -> str:
    """Boolean `expr`, reading `variables.<name>`, as an expression that reads none: the variables it needs bound
    in definition order (each may read only those defined before it, as in a policy)."""
    wanted = needed(expr, variables)
    order = [name for name, _ in variables]
    for position, (name, value) in enumerate(variables):
        later = reads(value) - set(order[:position])
        if name in wanted and later:
            raise ValueError(f"variable {name} reads {', '.join(sorted(later))}, defined after it")
    body = _renamed(expr)
    for name, value in reversed(variables):
        if name in wanted:
            body = f"[{_renamed(value)}].exists({PREFIX}{name}, {body})"
    return body
