"""Precision of the op against float64 at positions up to 1,000,000, per q/k and cache dtype.

Llama-3 geometry (32 q / 8 kv heads x 128, NeoX, rope_theta 500000) and GPT-J style at the
same size; caches from `compute_cos_sin_cache` (angles in float64, rounded once to the cache
dtype) with 1,000,000 rows; q/k drawn from N(0, 1) in the q/k dtype; positions drawn from each
range below, the range's last position included. Two errors per row, relative L2 norm
(||out - ref|| / ||ref||) and max abs:

- vs exact: against the float64 rotation by the exact float64 angles, so the cache's rounding
  is included. This is the error a model sees.
- vs cache: against the float64 rotation by the same cache entries, so only the kernel's own
  arithmetic and output rounding remain.

`floor` is the relative L2 error of rounding the exact result to the q/k dtype, which no
kernel can beat. Usage: python benchmarks/precision.py [--device cuda] [--tokens 512]
"""

from __future__ import annotations

import argparse

import torch

import rope_compat
from rope_compat.cli.reference import rope_reference

THETA, ROT, HQ, HK = 500000.0, 128, 32, 8
MAX_POSITION = 1_000_000
RANGES = ((0, 4096), (4096, 131072), (131072, 524288), (524288, MAX_POSITION + 1))
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def draw_positions(lo: int, hi: int, n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.cat([torch.randint(lo, hi, (n - 1,), generator=gen), torch.tensor([hi - 1])])


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


def max_abs(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.double().cpu() - ref).abs().max().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=512, help="tokens per range of positions")
    args = ap.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    backend = rope_compat.backend_for(device)

    # Exact cache: float64 angles, kept in float64 for the reference.
    exact = rope_compat.compute_cos_sin_cache(ROT, MAX_POSITION + 1, {"rope_theta": THETA}, dtype=torch.float64)
    caches = {name: exact.to(dtype).to(device) for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16))}

    print(f"device {device} ({backend}), {HQ}/{HK} heads x {ROT}, rope_theta {THETA:g}, "
          f"{args.tokens} tokens per range, errors against float64\n")
    print("style | q/k | cache | positions | rel L2 vs exact | max abs vs exact | rel L2 vs cache | floor")
    print("---|---|---|---|---|---|---|---")
    worst = {}
    for is_neox in (True, False):
        for qk_name, qk_dtype in DTYPES.items():
            for cache_name, cache in caches.items():
                for lo, hi in RANGES:
                    pos = draw_positions(lo, hi, args.tokens, gen)
                    q = torch.randn(args.tokens, HQ * ROT, generator=gen).to(qk_dtype)
                    k = torch.randn(args.tokens, HK * ROT, generator=gen).to(qk_dtype)
                    ref_q, ref_k = rope_reference(pos, q, k, ROT, exact, is_neox)
                    same_q, same_k = rope_reference(pos, q, k, ROT, cache.cpu(), is_neox)
                    out_q, out_k = q.to(device), k.to(device)
                    rope_compat.rotary_embedding(pos.to(device), out_q, out_k, ROT, cache, is_neox)
                    out = torch.cat([out_q.flatten(), out_k.flatten()])
                    ref = torch.cat([ref_q.flatten(), ref_k.flatten()])
                    same = torch.cat([same_q.flatten(), same_k.flatten()])
                    floor = rel_l2(ref.to(qk_dtype), ref)
                    e_exact, e_cache = rel_l2(out, ref), rel_l2(out, same)
                    key = (qk_name, cache_name)
                    worst[key] = max(worst.get(key, 0.0), e_exact)
                    print(f"{'neox' if is_neox else 'gptj'} | {qk_name} | {cache_name} | {lo:,}-{hi - 1:,} | "
                          f"{e_exact:.2e} | {max_abs(out, ref):.2e} | {e_cache:.2e} | {floor:.2e}", flush=True)
    print("\nworst relative L2 error vs exact over positions 0 - 1,000,000:")
    for (qk_name, cache_name), e in worst.items():
        print(f"  q/k {qk_name:4s} cache {cache_name:4s}: {e:.2e}")


if __name__ == "__main__":
    main()
