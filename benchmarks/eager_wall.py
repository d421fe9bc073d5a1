"""Eager host wall time per call at 1 token, repeated: the host is shared, so one loop is noisy.

Each of the README's four shapes and a 1-element torch `add_` (a call through torch's
dispatcher, for scale) is timed `--repeats` times, interleaved, with the benchmark's own
`eager_wall_us` (median of 9 loops of 200 calls). Prints the median and every run.
Usage: python benchmarks/eager_wall.py [--repeats 5]   (a CUDA device)
"""

import argparse
import statistics

import torch

from rope_compat.bench.inputs import make_inputs, rope_cache
from rope_compat.bench.peers import _rope_compat
from rope_compat.bench.shapes import MODEL_SHAPES
from rope_compat.bench.timing import eager_wall_us

SETS = 200


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("eager_wall.py times CUDA launches: it needs a CUDA device")
    gen = torch.Generator().manual_seed(0)
    steps = {}
    for name in ("llama3-8b", "llama3-70b-tp", "partial-rotary", "gptj"):
        shape = MODEL_SHAPES[name]
        cache = rope_cache(131072, shape.rot_dim, torch.float32, "cuda")
        steps[shape.label] = _rope_compat(make_inputs(shape, 1, SETS, cache, torch.bfloat16, gen))
    x = torch.zeros(1, device="cuda")
    steps["torch add_ (1 element)"] = lambda i: x.add_(1.0)
    runs = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            runs[name].append(eager_wall_us(step, SETS))
    for name, us in runs.items():
        print(f"{name:28s} median {statistics.median(us):5.2f} us   runs " + " ".join(f"{u:.2f}" for u in us))


if __name__ == "__main__":
    main()
