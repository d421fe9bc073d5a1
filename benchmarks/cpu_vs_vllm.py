"""CPU time of rope-compat's rotary_embedding against vLLM's CPU kernel, in one run.

    python benchmarks/cpu_vs_vllm.py [--tokens 1 64 2048] [--threads N]

Both get identical inputs (a Llama-like layer: 32 query and 8 key heads of 128 dims, full
NeoX rotation, cache dtype = q dtype, the only kind vLLM's CPU kernel accepts). Each
measurement is the best over several rounds of the mean of many back-to-back calls, with
the two implementations alternating round by round, so that load from other processes
affects both alike. Needs vLLM's CPU build (`vllm._custom_ops`) for the comparison; without
it only rope-compat's times are printed.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Optional

import torch

import rope_compat

HEADS, KV_HEADS, HEAD_SIZE, CACHE_ROWS = 32, 8, 128, 8192


def _vllm_rotary() -> Optional[Callable]:
    try:
        from vllm import _custom_ops
    except Exception:  # not installed, or a build without the CPU ops
        return None
    return _custom_ops.rotary_embedding


def _calls_per_round(tokens: int) -> int:
    """Enough calls for a few milliseconds per round."""
    return max(3, 20000 // (tokens + 20))


def _time_us(fn: Callable[[], None], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def measure(tokens: int, dtype: torch.dtype, rounds: int, vllm_rotary: Optional[Callable]):
    """Best-of-rounds microseconds per call for rope-compat and (if present) vLLM."""
    positions = torch.randint(0, CACHE_ROWS, (tokens,))
    query = torch.randn(tokens, HEADS * HEAD_SIZE, dtype=dtype)
    key = torch.randn(tokens, KV_HEADS * HEAD_SIZE, dtype=dtype)
    angles = torch.rand(CACHE_ROWS, HEAD_SIZE // 2, dtype=torch.float64) * 100
    cache = torch.cat([angles.cos(), angles.sin()], -1).to(dtype)
    args = (positions, query, key, HEAD_SIZE, cache, True)
    candidates = {"rope_compat": lambda: rope_compat.rotary_embedding(*args)}
    if vllm_rotary is not None:
        candidates["vllm"] = lambda: vllm_rotary(*args)
    calls = _calls_per_round(tokens)
    best = {name: float("inf") for name in candidates}
    for fn in candidates.values():  # warm up (allocator, thread pool, caches)
        _time_us(fn, calls)
    for r in range(rounds):
        order = list(candidates.items())
        for name, fn in order if r % 2 == 0 else reversed(order):
            best[name] = min(best[name], _time_us(fn, calls))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 2048])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    vllm_rotary = _vllm_rotary()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"{HEADS} q / {KV_HEADS} kv heads, head_size {HEAD_SIZE}, NeoX, full rotation"
    )
    if vllm_rotary is None:
        print("vllm._custom_ops not importable: rope_compat times only")
    print(f"{'dtype':>9} {'tokens':>7} {'vllm us':>10} {'rope_compat us':>15} {'ratio':>7}")
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for tokens in args.tokens:
            best = measure(tokens, dtype, args.rounds, vllm_rotary)
            ours = best["rope_compat"]
            if "vllm" in best:
                theirs = best["vllm"]
                print(f"{dtype_name:>9} {tokens:>7} {theirs:>10.1f} {ours:>15.1f} {ours / theirs:>6.1f}x")
            else:
                print(f"{dtype_name:>9} {tokens:>7} {'-':>10} {ours:>15.1f} {'-':>7}")


if __name__ == "__main__":
    main()
