"""`rope-compat bench`: time rope-compat beside its peers; tables, CSV, plot."""

from __future__ import annotations

import importlib.util
import sys

import torch

from ..bench import format_tables, plot, run, write_csv

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("bench: --device cuda, but no CUDA device is available", file=sys.stderr)
        return 2
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        # Said before the run, which can take minutes, rather than after it.
        print("bench: --plot needs matplotlib: pip install 'rope-compat[plot]'", file=sys.stderr)
        return 2
    result = run(
        shapes=args.shapes,
        tokens=args.tokens,
        device=device,
        dtype=DTYPES[args.dtype],
        cache_dtype=DTYPES[args.cache_dtype],
        cache_rows=args.cache_rows,
        peers=args.peers,
        calls_per_graph=args.calls_per_graph,
        max_sets=args.max_sets,
        target_s=args.target_s,
        progress=not args.no_progress,
        seed=args.seed,
    )
    print(format_tables(result))
    if args.csv:
        write_csv(result, args.csv)
        print(f"\nwrote {args.csv}")
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0 if result.rows else 1
