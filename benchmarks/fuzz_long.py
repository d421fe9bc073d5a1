"""Long fuzz run of the rotary op against the float64 reference (default: 10,000 CUDA cases).

Same cases as tests/test_fuzz.py (tests/fuzz_cases.py), drawn from a seeded `random.Random`
so a run is reproducible by its seed; on CUDA some tokens get out-of-range positions and must
be left untouched. Prints the number of cases, failures (with the first failing cases in
full), and the worst error per dtype in units of the tolerance (<= 1 passes). Exits 1 on any
failure.

    python benchmarks/fuzz_long.py [--cases 10000] [--seed 0] [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402

from fuzz_cases import RandomChooser, draw_spec, run_spec  # noqa: E402
from tolerances import TOLERANCES  # noqa: E402

SHOWN_FAILURES = 5


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    import rope_compat

    print(f"device {args.device}, backend {rope_compat.backend_for(args.device)}, seed {args.seed}")
    chooser = RandomChooser(random.Random(args.seed))
    worst = defaultdict(float)  # dtype -> worst error / tolerance
    counts = defaultdict(int)
    failures = []
    start = time.perf_counter()
    for i in range(args.cases):
        spec = draw_spec(chooser, allow_stray=args.device != "cpu")
        counts[spec.dtype] += 1
        try:
            out = run_spec(spec, args.device)
        except Exception as e:  # a case that raises is a failure, and the run goes on
            failures.append((i, spec, f"{type(e).__name__}: {e}"))
            continue
        err = out.max_error(TOLERANCES[spec.dtype])
        worst[spec.dtype] = max(worst[spec.dtype], err)
        if err > 1.0 or out.changed_outside:
            failures.append(
                (i, spec, f"error {err:.3g} x tolerance, {out.changed_outside} elements changed outside")
            )
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()  # a kernel fault surfaces here at the latest
    elapsed = time.perf_counter() - start

    print(f"{args.cases} cases in {elapsed:.1f} s, {len(failures)} failures")
    for dtype in sorted(counts, key=str):
        print(f"  {str(dtype):15} {counts[dtype]:6} cases, worst error {worst[dtype]:.3f} x tolerance")
    for i, spec, why in failures[:SHOWN_FAILURES]:
        print(f"FAIL case {i}: {why}\n  {spec!r}")
    if len(failures) > SHOWN_FAILURES:
        print(f"... and {len(failures) - SHOWN_FAILURES} more")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
