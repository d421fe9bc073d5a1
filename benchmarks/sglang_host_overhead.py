"""Host time per eager call: SGLang's current rope call through patch_sglang() vs rope-compat direct.

SGLang's RotaryEmbedding.forward_cuda calls
`apply_rope_with_cos_sin_cache_inplace(positions=..., q=q_rope, k=k_rope, cos_sin_cache=...,
is_neox=..., fused_args=...)` with `[T, H, D]` views. Where SGLang is installed (0.5.20+),
`patch_sglang()` rebinds that name and this script calls the patched binding in SGLang's
module; without SGLang it calls what patch_sglang() would bind (a distinct copy of
`rope_compat.sglang.apply_rope_with_cos_sin_cache_inplace`). Compared with the direct call
`rope_compat.rotary_embedding(positions, q, k, D, cache, is_neox)` (and, with the fused KV
store, `rope_compat.rotary_embedding_set_kv`). Target: at most 0.3 us per call over direct.

Each sample is the wall time of a loop of eager calls (no sync inside it) divided by the
calls. At decode sizes the host, not the GPU, is the bound, so this is the host time per call.
The overhead is the median, over many short rounds, of the difference between the patched and
the direct call timed in the same round, with a 95% confidence interval of that median. Why
short rounds: the host's speed drifts by more than the 0.3 us target over seconds (runs of a
few long rounds disagreed by 0.27 us on an unchanged path), and a difference taken within
one millisecond cancels the drift. The order of the variants alternates from round to round,
and the garbage collector is off while timing (as in timeit). The script also checks that
both paths give bit-identical results and, with --profile, that they launch the same CUDA
kernels.

With --no-launch (the compiled extension, no GPU needed) it times the host work alone: CPU
tensors, and the compiled entry points' fallbacks set to no-ops, so that nothing is checked or
launched; the figures are the Python and C layers' own cost. That mode also times
`rope_and_store` (reading the arg's fields) on its own.

    python benchmarks/sglang_host_overhead.py [--tokens 1] [--calls 200] [--rounds 401] [--profile | --no-launch]
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import time

import torch

import rope_compat
from rope_compat.compat._bindings import distinct_copy, runs_code_of


def patched_target():
    """(function SGLang's layer would call, where it comes from)."""
    try:
        import sglang.kernels.ops.attention.rope as sgl_rope  # noqa: F401
    except Exception as e:  # SGLang absent, or a version without its own rope kernel
        return distinct_copy(rope_compat.sglang.apply_rope_with_cos_sin_cache_inplace), f"no SGLang ({type(e).__name__})"
    rope_compat.patch_sglang()
    fn = sgl_rope.apply_rope_with_cos_sin_cache_inplace
    assert runs_code_of(fn, rope_compat.sglang.apply_rope_with_cos_sin_cache_inplace)
    return fn, "SGLang's module, patched by patch_sglang()"


class Arg4:
    """SGLang's 4-field FusedSetKVBufferArg (value, k_buffer, v_buffer, cache_loc)."""

    def __init__(self, value, k_buffer, v_buffer, cache_loc):
        self.value, self.k_buffer, self.v_buffer, self.cache_loc = value, k_buffer, v_buffer, cache_loc


def per_call_us(fn, calls: int, sync=torch.cuda.synchronize) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    sync()
    return (t1 - t0) / calls * 1e6


def median_ci(xs: list) -> tuple:
    """(median, low, high): the median and a distribution-free 95% interval for it (order
    statistics of the binomial(n, 1/2) quantiles)."""
    ys = sorted(xs)
    n = len(ys)
    half = 1.96 * math.sqrt(n) / 2
    lo, hi = max(int(math.floor(n / 2 - half)), 0), min(int(math.ceil(n / 2 + half)), n - 1)
    return statistics.median(ys), ys[lo], ys[hi]


def kernels(fn) -> list:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted(e.name for e in prof.events() if e.device_type.name == "CUDA")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-size", type=int, default=128)
    p.add_argument("--calls", type=int, default=200, help="calls per sample")
    p.add_argument("--rounds", type=int, default=401)
    p.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    p.add_argument("--profile", action="store_true", help="also compare the launched CUDA kernels")
    p.add_argument("--no-launch", action="store_true", help="host work only: CPU tensors, no-op fallbacks")
    a = p.parse_args()
    if a.no_launch:
        C = rope_compat.api._C
        assert C is not None, "--no-launch needs the compiled extension (a CUDA build of torch)"
        for name in ("rotary_embedding", "rotary_embedding_set_kv"):
            C.set_fallback(name, lambda *args, **kwargs: None)
        dev = "cpu"
    else:
        assert torch.cuda.is_available(), "needs a CUDA device"
        dev = "cuda"
    dt, T, H, K, D = torch.bfloat16, a.tokens, a.heads, a.kv_heads, a.head_size
    target, origin = patched_target()
    print(f"rope-compat {rope_compat.__version__}, CUDA kernel {'built' if rope_compat.has_cuda_kernel() else 'NOT built'}; "
          f"patched target: {origin}; {H}/{K}x{D} bf16, {T} token(s), float32 cache of 131072 rows")

    qkv = torch.randn(T, (H + 2 * K) * D, dtype=dt, device=dev)
    q = qkv[:, : H * D].view(T, H, D)  # the views forward_cuda passes
    k = qkv[:, H * D: (H + K) * D].view(T, K, D)
    v = qkv[:, (H + K) * D:]
    cache = torch.randn(131072, D, dtype=torch.float32, device=dev)
    positions = torch.randint(0, 131072, (T,), device=dev)
    k_buffer = torch.zeros(4096, K * D, dtype=dt, device=dev)
    v_buffer = torch.zeros_like(k_buffer)
    loc = torch.randperm(4096, device=dev)[:T]
    arg = Arg4(v, k_buffer, v_buffer, loc)
    direct_rope, direct_store = rope_compat.rotary_embedding, rope_compat.rotary_embedding_set_kv

    variants = {
        "rope: direct rope_compat.rotary_embedding": lambda: direct_rope(positions, q, k, D, cache, True),
        "rope: SGLang's call, patched": lambda: target(
            positions=positions, q=q, k=k, cos_sin_cache=cache, is_neox=True, fused_args=None),
        "rope+KV store: direct rope_compat.rotary_embedding_set_kv": lambda: direct_store(
            positions, q, k, D, cache, True, v, k_buffer, v_buffer, loc),
        "rope+KV store: SGLang's call, patched": lambda: target(
            positions=positions, q=q, k=k, cos_sin_cache=cache, is_neox=True, fused_args=arg),
    }

    names = list(variants)
    if a.no_launch:
        from rope_compat.compat.sgl import rope_and_store

        variants["rope+KV store: rope_and_store alone"] = lambda: rope_and_store(arg, positions, q, k, D, cache, True)
        variants["an empty lambda (the loop's own cost)"] = lambda: None
    # Same results, bit for bit (each pair from the same inputs).
    for i in () if a.no_launch else (0, 2):
        outs = []
        for name in names[i: i + 2]:
            base = qkv.clone()
            qkv.copy_(base)
            k_buffer.zero_()
            v_buffer.zero_()
            variants[name]()
            outs.append((qkv.clone(), k_buffer.clone(), v_buffer.clone()))
            qkv.copy_(base)
        assert all(torch.equal(x, y) for x, y in zip(*outs)), f"{names[i]} and {names[i + 1]} differ"
    if not a.no_launch:
        print("results: bit-identical between direct and patched calls")
    if a.profile and not a.no_launch:
        for i in (0, 2):
            ka, kb = kernels(variants[names[i]]), kernels(variants[names[i + 1]])
            print(f"kernels {'same' if ka == kb else 'DIFFER'}: {ka} vs {kb}")

    if not a.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # no migration between CPUs
    sync = (lambda: None) if a.no_launch else torch.cuda.synchronize
    for fn in variants.values():  # warm-up
        per_call_us(fn, 1000, sync)
    samples = {name: [] for name in variants}
    items = list(variants.items())
    gc.disable()
    try:
        for r in range(a.rounds):
            for name, fn in items if r % 2 == 0 else items[::-1]:
                samples[name].append(per_call_us(fn, a.calls, sync))
    finally:
        gc.enable()
    print(f"\n{a.rounds} rounds of {a.calls} calls per variant")
    print(f"{'variant':<60} {'median us':>10} {'min us':>8}")
    for name, xs in samples.items():
        print(f"{name:<60} {statistics.median(xs):>10.3f} {min(xs):>8.3f}")
    pairs = [(names[0], names[1]), (names[2], names[3])]
    if a.no_launch:
        pairs.append((names[2], "rope+KV store: rope_and_store alone"))
    for base, other in pairs:
        d = [y - x for x, y in zip(samples[base], samples[other])]
        med, lo, hi = median_ci(d)
        print(f"{other}: {med:+.3f} us per call over direct (95% interval {lo:+.3f} to {hi:+.3f}; "
              f"median of per-round differences; target <= +0.3)")


if __name__ == "__main__":
    main()
