"""Where one review's time goes inside the server, stage by stage, in-process. Prints numbers; not a test.

    python bench/stages.py                      # µs per stage (best of several rounds), GPU Pod /mutate
    python bench/stages.py --review FILE.json   # another AdmissionReview body

Timings on a shared machine move with its load; instruction counts do not. To count instructions of one
stage deterministically, run it alone under valgrind twice (with and without the loop) and subtract (the
interpreter itself, not a wrapper script such as pyenv's shim, which valgrind would count instead):

    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
        "$(python -c 'import sys; print(sys.executable)')" bench/stages.py --only answer --count 2000
                                                               # and again with --count 0

Inside a loaded server a review costs about twice what it costs here: between two reviews the clients and the
other worker run on the same cores and evict the engine's code and data from the caches. `--cold` evicts them
before each call (it writes over a buffer larger than this machine's 2 MiB L2), and cachegrind's cache
simulation counts the misses that a review's first touch of its code (LLi) and data (LLd) costs:

    valgrind --tool=cachegrind --cache-sim=yes --LL=2097152,16,64 --cachegrind-out-file=/dev/null \\
        "$(python -c 'import sys; print(sys.executable)')" bench/stages.py --only answer --count 500 --cold
                                                               # and again with --only nothing (the eviction alone)

Stages are the server's own calls, on the server's own objects (`create_app` with the packaged rules,
INFO logging to /dev/null, metrics in multiprocess mode as under gunicorn); `answer` is all of them together.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry  # noqa: E402

from webhook.admission import logs, metrics  # noqa: E402
from webhook.admission.app import AdmissionServer, create_app, server_of  # noqa: E402
from webhook.admission.review import build_response, decode_json, parse_review  # noqa: E402
from webhook.admission.settings import Settings  # noqa: E402
from webhook.policy.engine import Context, evaluate  # noqa: E402
from webhook.policy.patch import operations  # noqa: E402

EVICT_BYTES = 4 * 1024 * 1024  # twice the L2 of a core here
DEFAULT_REVIEW = REPO / "tests" / "data" / "admission-reviews" / "pod-create-from-replicaset-gpu.json"


def stages(server: AdmissionServer, body: bytes) -> dict[str, Callable[[], Any]]:
    """Each stage of `AdmissionServer.answer` as a call on prepared inputs, in the order the server runs them."""
    req = parse_review(body)
    policy = server.store.policy
    ctx = Context(namespace=req.namespace, operation=req.operation, mode="mutate", old_object=req.old_obj)
    verdict = evaluate(policy, req.obj, ctx)
    decision = server._decide("mutate", req, verdict, policy.digest)
    outcome = "deny" if not decision.allowed else ("patch" if decision.patch else "allow")
    assert req.obj is not None
    obj = req.obj
    return {
        "json decode (orjson)": lambda: decode_json(body),
        "parse_review (incl. decode)": lambda: parse_review(body),
        "evaluate (engine)": lambda: evaluate(policy, obj, ctx),
        "patch operations": lambda: operations(obj, verdict.edits),
        "decide (incl. patch)": lambda: server._decide("mutate", req, verdict, policy.digest),
        "build_response": lambda: build_response(req, decision),
        "record (metrics + log line)": lambda: server._record("mutate", req, verdict, outcome, 0.0002),
        "answer (all of the above)": lambda: server.answer("mutate", body),
    }


def _module_of(where: tuple[str, int, str]) -> str:
    path = where[0]
    if path == "~":  # a C function or method: isinstance, dict.get, orjson.loads, ...
        return "C calls"
    return str(Path(path).relative_to(REPO)) if path.startswith(str(REPO)) else "other Python"


def profile(call: Callable[[], Any], count: int) -> None:
    """Own time and calls per review of `call`, summed by module; the profiler's overhead weighs on small
    functions, so the shares are a map of where the calls go, not a measure to set against instruction counts."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(count):
        call()
    profiler.disable()
    by_module: dict[str, list[float]] = {}
    for where, (_, calls, own, _, _) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        entry = by_module.setdefault(_module_of(where), [0.0, 0.0])
        entry[0] += own
        entry[1] += calls
    total = sum(own for own, _ in by_module.values())
    print(f"answer(), {count} calls: {sum(c for _, c in by_module.values()) / count:.0f} calls per review")
    for module, (own, calls) in sorted(by_module.items(), key=lambda item: -item[1][0]):
        print(f"  {module:40} {calls / count:6.0f} calls  {own / total * 100:4.0f} % of own time")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--review", type=Path, default=DEFAULT_REVIEW, help="AdmissionReview body to answer")
    parser.add_argument("--number", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per stage (the best is kept)")
    parser.add_argument("--only", help="run one stage (a prefix of its name) --count times and print nothing")
    parser.add_argument("--count", type=int, default=0, help="with --only: calls to make")
    parser.add_argument("--cold", action="store_true", help="with --only: evict the caches before each call")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile 5,000 answer() calls: own time and calls per review, by module")
    args = parser.parse_args(argv)

    metrics.enable_multiprocess(Path(tempfile.mkdtemp(prefix="bench-stages-metrics-")))
    sys.stderr = os.fdopen(os.dup(2), "w", buffering=1)  # our own errors still show
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the INFO review lines go nowhere, as fast as stderr can be
    logs.configure("INFO")
    server = server_of(create_app(Settings(), registry=CollectorRegistry()))
    body = args.review.read_bytes()
    table = stages(server, body)
    for call in table.values():  # warm every memo the server warms on its first reviews
        for _ in range(200):
            call()

    if args.profile:
        profile(table["answer (all of the above)"], 5000)
        return 0

    if args.only:
        choices = {**table, "nothing (what --cold costs alone)": lambda: None}
        matches = [c for name, c in choices.items() if name.startswith(args.only)]
        if len(matches) != 1:
            parser.error(f"{args.only!r} starts {len(matches)} stage names, not one; stages: {', '.join(choices)}")
        [call] = matches
        evict = bytearray(EVICT_BYTES)
        lines = b"\1" * (EVICT_BYTES // 64)
        for _ in range(args.count):
            if args.cold:
                evict[::64] = lines  # one write per cache line
            call()
        return 0

    print(f"{args.review.name}: {len(body)} bytes, /mutate; best of {args.rounds} rounds x {args.number} calls")
    for name, call in table.items():
        best = min(timeit.repeat(call, number=args.number, repeat=args.rounds)) / args.number
        print(f"  {name:30} {best * 1e6:8.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
