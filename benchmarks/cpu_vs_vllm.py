"""CPU time of rope-compat's kernel, its Torch implementation and vLLM's CPU kernel, in one run.

    python benchmarks/cpu_vs_vllm.py [--tokens 1 64 2048] [--styles neox gptj]
                                     [--dtypes bfloat16 float32] [--rounds 15] [--threads N]

All get identical inputs (a Llama-like layer: 32 query and 8 key heads of 128 dims, full
rotation, NeoX or GPT-J, cache dtype = q dtype, the only kind vLLM's CPU kernel accepts):
- `kernel`: rope_compat.rotary_embedding, the eager call as users make it (served by the
  compiled CPU kernel when it is built and loaded; the header says which serves);
- `torch`: the Torch implementation called directly (what serves without the kernel);
- `vllm`: vllm._custom_ops.rotary_embedding (through torch's dispatcher, as engines call it).
A measurement is the mean over a batch of back-to-back calls (a few milliseconds). Rounds
interleave the candidates, in an order that rotates round by round, so that load from other
processes affects them alike. Each figure is the minimum over rounds; `spread` is
(median - min) / min over those rounds, the noise of the run. Ratios divide the minima of this
one run: vllm/kernel and torch/kernel (above 1: the kernel is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

import rope_compat
from rope_compat.ops import torch_impl

HEADS, KV_HEADS, HEAD_SIZE, CACHE_ROWS = 32, 8, 128, 8192


def _vllm_rotary() -> Optional[Callable]:
    try:
        from vllm import _custom_ops
    except Exception:  # not installed, or a build without the CPU ops
        return None
    return _custom_ops.rotary_embedding


def _calls_per_batch(tokens: int) -> int:
    """Enough calls for a few milliseconds per batch."""
    return max(3, 20000 // (tokens + 20))


def _time_us(fn: Callable[[], None], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def measure(tokens: int, dtype: torch.dtype, is_neox: bool, rounds: int,
            vllm_rotary: Optional[Callable]) -> Dict[str, List[float]]:
    """Microseconds per call of each candidate, one figure per round."""
    positions = torch.randint(0, CACHE_ROWS, (tokens,))
    query = torch.randn(tokens, HEADS * HEAD_SIZE, dtype=dtype)
    key = torch.randn(tokens, KV_HEADS * HEAD_SIZE, dtype=dtype)
    angles = torch.rand(CACHE_ROWS, HEAD_SIZE // 2, dtype=torch.float64) * 100
    cache = torch.cat([angles.cos(), angles.sin()], -1).to(dtype)
    args = (positions, query, key, HEAD_SIZE, cache, is_neox)
    candidates = {
        "kernel": lambda: rope_compat.rotary_embedding(*args),
        "torch": lambda: torch_impl.rotary_embedding(*args),
    }
    if vllm_rotary is not None:
        candidates["vllm"] = lambda: vllm_rotary(*args)
    calls = _calls_per_batch(tokens)
    for fn in candidates.values():  # warm up (allocator, thread pool, caches)
        _time_us(fn, calls)
    times: Dict[str, List[float]] = {name: [] for name in candidates}
    order = list(candidates.items())
    for r in range(rounds):
        for name, fn in order[r % len(order):] + order[: r % len(order)]:
            times[name].append(_time_us(fn, calls))
    return times


def _fmt(samples: List[float]) -> str:
    best = min(samples)
    spread = (statistics.median(samples) - best) / best * 100
    return f"{best:9.2f} ±{spread:3.0f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 2048])
    parser.add_argument("--styles", nargs="+", default=["neox", "gptj"], choices=["neox", "gptj"])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    vllm_rotary = _vllm_rotary()
    from rope_compat.ops import extension

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {HEADS} q / {KV_HEADS} kv heads, "
        f"head_size {HEAD_SIZE}, full rotation; rope_compat CPU backend: {rope_compat.backend_for('cpu')}"
        + (f" ({extension.cpu_capability()})" if extension.has_cpu_kernel() else "")
    )
    print(f"{args.rounds} interleaved rounds per row; us per call: min ±spread ((median - min) / min)")
    if vllm_rotary is None:
        print("vllm._custom_ops not importable: no vLLM column")
    print(f"| style | dtype | tokens | kernel us | vLLM us | Torch impl us | vLLM / kernel | Torch / kernel |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for style in args.styles:
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            for tokens in args.tokens:
                t = measure(tokens, dtype, style == "neox", args.rounds, vllm_rotary)
                ours = min(t["kernel"])
                vllm = f"{_fmt(t['vllm'])} | {min(t['vllm']) / ours:.2f}x" if "vllm" in t else "- | -"
                vllm_cell, vllm_ratio = vllm.split(" | ")
                print(f"| {style} | {dtype_name} | {tokens} | {_fmt(t['kernel'])} | {vllm_cell} | "
                      f"{_fmt(t['torch'])} | {vllm_ratio} | {min(t['torch']) / ours:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
