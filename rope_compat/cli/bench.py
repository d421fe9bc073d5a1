"""`rope-compat bench`: time rope-compat beside its peers; tables, CSV, plot."""

from __future__ import annotations

import sys

import torch

from ..bench import format_tables, plot, run, write_csv
from ..bench.shapes import parse_tokens

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("bench: --device cuda, but no CUDA device is available", file=sys.stderr)
        return 2
    result = run(
        shapes=args.shapes.split(",") if args.shapes else None,
        tokens=parse_tokens(args.tokens) if args.tokens else None,
        device=device,
        dtype=DTYPES[args.dtype],
        cache_dtype=DTYPES[args.cache_dtype],
        cache_rows=args.cache_rows,
        peers=[p for p in args.peers.split(",") if p] if args.peers is not None else None,
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
