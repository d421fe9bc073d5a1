"""Command line: `rope-compat info | verify | bench` (also `python -m rope_compat ...`)."""

from __future__ import annotations

import argparse
from typing import Callable, List, Optional, TypeVar

from ..bench.shapes import MODEL_SHAPES, Shape, parse_shape, parse_tokens

T = TypeVar("T")


def _positive_int(text: str) -> int:
    # argparse names the option in its message when this raises.
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parsed_by(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from a parser that raises ValueError: its message reaches the usage
    error, which names the option (a plain ValueError would be reported as 'invalid value')."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def _shapes(text: str) -> List[Shape]:
    return [parse_shape(s) for s in text.split(",")]


def _peers(text: str) -> List[str]:
    from ..bench.peers import check_peer_names  # the peers module is for `bench` alone

    names = [p for p in text.split(",") if p]
    check_peer_names(names)
    return names


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rope-compat", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="versions, compiled kernel, devices and backends, peers, patches")
    info.add_argument("--json", action="store_true", help="print JSON")

    verify = sub.add_parser("verify", help="check results against a float64 reference and installed peers")
    verify.add_argument("--device", action="append", choices=["cpu", "cuda"],
                        help="device to check (repeatable; default: cpu and cuda when present)")
    verify.add_argument("--no-external", action="store_true", help="skip vLLM/FlashInfer/sgl-kernel")
    verify.add_argument("--seed", type=int, default=0)
    verify.add_argument("--impl", metavar="MODULE:FUNCTION",
                        help="check this function (rotary_embedding's signature) instead of rope-compat's")

    bench = sub.add_parser("bench", help="time rope-compat beside roofline, Torch and other kernels")
    bench.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when present")
    bench.add_argument("--shapes", metavar="LIST", type=_parsed_by(_shapes),
                       help=f"comma list of {', '.join(MODEL_SHAPES)} or 'Hq/HkxD[:rot][:neox|gptj]' "
                            "(default: all models)")
    bench.add_argument("--tokens", metavar="LIST", type=_parsed_by(parse_tokens),
                       help="comma list (1,16,1024) or power-of-two range (1-131072); "
                            "default 1,16,128,1024,8192,32768,131072 on CUDA, 1,16,256 on the CPU")
    bench.add_argument("--peers", metavar="LIST", type=_parsed_by(_peers),
                       help="comma list of roofline, torch eager, torch.compile, vllm, flashinfer, "
                            "sgl-kernel (default: all available; '' for rope-compat alone)")
    bench.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    bench.add_argument("--cache-dtype", choices=["bf16", "fp16", "fp32"], default="fp32")
    bench.add_argument("--cache-rows", type=_positive_int, default=131072)
    bench.add_argument("--calls-per-graph", type=_positive_int, default=100,
                       help="calls per CUDA graph (default 100: the cost of launching a graph "
                            "spread over many calls)")
    bench.add_argument("--max-sets", type=_positive_int, default=None,
                       help="cap on the input sets to rotate through (default: no cap, enough to "
                            "exceed twice the L2 at every size); 1 times every call on the same, "
                            "L2-warm inputs")
    bench.add_argument("--target-s", type=float, default=0.2,
                       help="seconds of timed work per measurement (more: steadier figures)")
    bench.add_argument("--csv", metavar="PATH", help="write every measurement as CSV")
    bench.add_argument("--plot", metavar="PNG", help="plot time vs tokens per shape (needs matplotlib)")
    bench.add_argument("--no-progress", action="store_true")
    bench.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the `rope-compat` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    # Each command's module is imported only when it runs.
    if args.command == "info":
        from . import info as command
    elif args.command == "verify":
        from . import verify as command
    else:
        from . import bench as command
    return command.main(args)
