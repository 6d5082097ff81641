"""The webhook with its answer() changed, as reference points: for `bench/load.py --references`. Not a test.

    python bench/variants.py once MODULE [ARGS...]   # `python -m MODULE ARGS...`, every review answered from
                                                      # the first one's answer: the server without its engine
    python bench/variants.py twice MODULE [ARGS...]  # every review answered twice, the second answer sent

`once` measures what the stack costs the webhook apart from `AdmissionServer.answer` (Flask route, a larger
response, metrics and log threads). `twice` measures what one more answer() costs right after the first, while
the engine's code and data are still in the caches: were it much cheaper than the first, the difference would be
the first touch of that code and data (docs/performance.md). The uid is not echoed by `once`: the
load clients check the HTTP status only.
"""

from __future__ import annotations

import runpy
import sys
from typing import Any


def patch(variant: str) -> None:
    """Replace `AdmissionServer.answer` for `variant` (in this process, before gunicorn forks its workers)."""
    from webhook.admission.app import AdmissionServer

    answer = AdmissionServer.answer
    first: dict[int, tuple[int, dict[str, Any]]] = {}

    def once(self: AdmissionServer, mode: Any, body: bytes) -> tuple[int, dict[str, Any]]:
        if id(self) not in first:
            first[id(self)] = answer(self, mode, body)
        return first[id(self)]

    def twice(self: AdmissionServer, mode: Any, body: bytes) -> tuple[int, dict[str, Any]]:
        answer(self, mode, body)
        return answer(self, mode, body)

    AdmissionServer.answer = {"once": once, "twice": twice}[variant]  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    variant, module, *rest = argv
    if variant not in ("once", "twice"):
        raise SystemExit(f"variants.py: the variant is 'once' or 'twice', not {variant!r}")
    patch(variant)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
