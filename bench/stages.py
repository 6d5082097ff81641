from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import orjson  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from webhook.admission import logs, metrics  # noqa: E402
from webhook.admission.app import AdmissionServer, create_app, server_of  # noqa: E402
from webhook.admission.review import build_response, decode_json, request_of  # noqa: E402
from webhook.admission.settings import Settings  # noqa: E402
from webhook.policy import checks, pods  # noqa: E402
from webhook.policy.chosen import Collector  # noqa: E402
from webhook.policy.class_choice import choose_class  # noqa: E402
from webhook.policy.class_edits import class_changes  # noqa: E402
from webhook.policy.engine import Context, evaluate  # noqa: E402
from webhook.policy.patch import operations  # noqa: E402

EVICT_BYTES = 4 * 1024 * 1024  # twice the L2 of a core here
DEFAULT_REVIEW = REPO / "tests" / "data" / "admission-reviews" / "pod-create-from-replicaset-gpu.json"


def stages(server: AdmissionServer, body: bytes) -> dict[str, Callable[[], Any]]:
    """Each stage of `AdmissionServer.answer` as a call on prepared inputs, in the order the server runs them.

    The class choice and the class changes (edits and their patch, memoised) are parts of `evaluate`; `decide`
    calls `operations` only for a patch the class memo does not have (this stage shows what that costs)."""
    document = decode_json(body)
    req = request_of(document)
    policy = server.store.policy
    ctx = Context(namespace=req.namespace, operation=req.operation, mode="mutate", old_object=req.old_obj)
    verdict = evaluate(policy, req.obj, ctx)
    decision = server._decide("mutate", req, verdict, policy.digest)
    outcome = "deny" if not decision.allowed else ("patch" if decision.patch else "allow")
    response = build_response(req, decision)
    assert req.obj is not None
    obj = req.obj
    findings = [(f.rule, f.enforcement) for f in (*verdict.violations, *verdict.warnings)]
    table: dict[str, Callable[[], Any]] = {
        "json decode (orjson)": lambda: decode_json(body),
        "review parsing (request_of)": lambda: request_of(document),
        "policy evaluation (evaluate)": lambda: evaluate(policy, obj, ctx),
    }
    specs = pods.pod_specs(obj)
    if verdict.classes and len(specs) == 1:  # a GPU pod spec: the engine chose its class
        ref = specs[0]
        per_resource = checks.check_containers(policy, ref, Collector(policy))
        namespace = req.namespace or "default"
        chosen = choose_class(policy, ref, namespace, ctx, per_resource, Collector(policy))
        assert chosen is not None
        table["  class choice (choose_class)"] = (
            lambda: choose_class(policy, ref, namespace, ctx, per_resource, Collector(policy)))
        table["  class changes (class_changes)"] = lambda: class_changes(policy, obj, ref, chosen)
    table.update({
        "decision (_decide, incl. patch)": lambda: server._decide("mutate", req, verdict, policy.digest),
        "  patch building (operations, without the memo)": lambda: operations(obj, verdict.edits),
        "response building (build_response)": lambda: build_response(req, decision),
        "metrics (Metrics.review)": lambda: server.metrics.review("mutate", req.kind.kind, outcome, findings, 0.0002),
        "logging (the INFO line)": lambda: server._log("mutate", req, verdict, outcome, 0.0002),
        "answer (all of the above)": lambda: server.answer("mutate", body),
        "response encoding (orjson.dumps, in the route)": lambda: orjson.dumps(response),
    })
    return table


def instructions(review: Path, stage: str, count: int) -> int:
    """Instructions valgrind counts for this script with `--only STAGE --count COUNT` (start-up included)."""
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
               sys.executable, __file__, "--review", str(review), "--only", stage, "--count", str(count)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def profile(review: Path, names: list[str], count: int) -> None:
    """Instructions per call of each stage, as a Markdown table: (count calls - none) / count."""
    base = instructions(review, "nothing", 0)  # the same start-up and warm-up as every stage's run
    print(f"{review.name}, /mutate: instructions per call, {count} calls less none (valgrind, PYTHONHASHSEED=0)\n")
    print("| stage | instructions |")
    print("|---|---|")
    for name in names:
        if name.startswith("answer"):
            shown = f"**{name}**"
        else:
            shown = name.strip()
            shown = f"&nbsp;&nbsp;{shown}" if name.startswith("  ") else shown
        per_call = (instructions(review, name.strip(), count) - base) / count
        print(f"| {shown} | {per_call:,.0f} |", flush=True)


def _module_of(where: tuple[str, int, str]) -> str:
    path = where[0]
    if path == "~":  # a C function or method: isinstance, dict.get, orjson.loads, ...
        return "C calls"
    return str(Path(path).relative_to(REPO)) if path.startswith(str(REPO)) else "other Python"


def calls(call: Callable[[], Any], count: int) -> None:
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
                        help="instructions per call of each stage under valgrind (--count calls, default 2000)")
    parser.add_argument("--calls", action="store_true",
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
        profile(args.review, list(table), args.count or 2000)
        return 0
    if args.calls:
        calls(table["answer (all of the above)"], 5000)
        return 0

    if args.only:
        choices = {**table, "nothing (what --cold costs alone)": lambda: None}
        matches = [c for name, c in choices.items() if name.strip().startswith(args.only)]
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
