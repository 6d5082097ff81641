"""The long soak: certificate rotations and rule edits (valid and invalid) under sustained keep-alive load,
then SIGTERM under load, repeated for as long as asked. The same scenarios as tests/admission/test_faults.py (which
runs short versions of them by default), with bigger numbers. Prints what happened; exits 1 on any failure.

    python bench/soak.py                     # 100 rotate/edit cycles (~3 min), then 5 SIGTERM rounds
    python bench/soak.py --cycles 1000 --sigterm-rounds 20
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS.parent))

import test_faults  # noqa: E402  (the scenarios live with their short tests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=100, help="rotation + invalid edit + valid edit cycles")
    parser.add_argument("--sigterm-rounds", type=int, default=5, help="servers stopped with SIGTERM under load")
    parser.add_argument("--clients", type=int, default=16, help="client threads during SIGTERM rounds")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpu-webhook-soak-"))
    started = time.monotonic()
    failed = False
    try:
        result, counts = test_faults.rotation_and_edits(work / "rotate", args.cycles)
        print(f"rotation/edit soak: {args.cycles} cycles in {time.monotonic() - started:.0f} s: "
              f"{result.answered} reviews answered under load, {len(result.failures)} failed; {counts}")
        failed |= bool(result.failures)
        for failure in result.failures[:10]:
            print(f"  FAILED: {failure}")
    except AssertionError as exc:
        print(f"rotation/edit soak FAILED: {exc}")
        failed = True
    for i in range(args.sigterm_rounds):
        (work / f"term-{i}").mkdir(parents=True)
        try:
            outcome = test_faults.sigterm_under_load(work / f"term-{i}", clients=args.clients, in_flight=6,
                                                     load_seconds=5)
            print(f"SIGTERM round {i + 1}: {outcome} (no answer cut, in-flight reviews answered)")
        except AssertionError as exc:
            print(f"SIGTERM round {i + 1} FAILED: {exc}")
            failed = True
    print(f"soak {'FAILED' if failed else 'passed'} in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
