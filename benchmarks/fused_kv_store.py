"""Rope with the KV-cache store on a GPU: µs per call from CUDA-graph replays.

Compared at each shape (bf16 NeoX, q/k/v sliced from one fused qkv tensor, float32 cache of
131072 rows, random int64 positions, cache_loc a random permutation of a larger KV cache):
  fused        rope_compat's rotary_embedding_set_kv, bf16 buffers (one launch)
  fused-fp8    the same with float8_e4m3fn buffers and k_scale/v_scale of 0.5 and 0.25
  fused-scaled, fused-fp8-scaled   bf16 and float8 buffers with scales of 0.3 and 0.7
  one-element  an in-place op on one element: what any kernel costs in a graph
  rope+copy    rope_compat's rotation plus two index_copy_ (the previous path)
  floor        one contiguous in-place pass (mul_) over as many bytes as the fused call must
               move: q and k rotated dims read and written, v read, the k and v rows written
  sgl-kernel   sgl-kernel's fused kernel, when --peer-dir holds a module `sgl_fused_peer`
               with fused(q, k, v, k_buffer, v_buffer, cos_sin_cache, positions, cache_loc,
               is_neox) built from sgl-kernel's own source

Input sets together exceed 2.5x the L2 at every size (each call reads fresh inputs); graphs
hold 100 calls; each figure is the min / median / max over repeats of replaying every graph.
Usage: python benchmarks/fused_kv_store.py [--tokens 1,16,...] [--peer-dir DIR] [--repeats N]
"""

from __future__ import annotations

import argparse
import importlib
import math
import statistics
import sys
from typing import Callable, Dict, List, Optional

import torch

import rope_compat

CALLS_PER_GRAPH = 100
SHAPES = {"32/8x128": (32, 8, 128), "64/8x128": (64, 8, 128)}
CACHE_ROWS = 131072


def l2_bytes() -> int:
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20) or (60 << 20)


class InputSet:
    def __init__(self, tokens: int, heads: int, kv_heads: int, head: int, rows: int, buffers: Dict[str, torch.Tensor]):
        qw, kw = heads * head, kv_heads * head
        self.qkv = torch.randn(tokens, qw + 2 * kw, dtype=torch.bfloat16, device="cuda")
        self.q = self.qkv[:, :qw]
        self.k = self.qkv[:, qw : qw + kw]
        self.v = self.qkv[:, qw + kw :]
        self.positions = torch.randint(0, CACHE_ROWS, (tokens,), device="cuda")
        self.loc = torch.randint(0, rows, (tokens,), device="cuda")
        self.buffers = buffers
        # The floor: an in-place pass reads and writes each element, so half the bytes moved.
        self.flat = torch.randn(tokens * moved_bytes(heads, kv_heads, head) // 4, dtype=torch.bfloat16,
                                device="cuda")


def moved_bytes(heads: int, kv_heads: int, head: int) -> int:
    """Bytes per token the fused bf16 call must move (full rotation)."""
    qk = (heads + kv_heads) * head * 2
    return 2 * qk + kv_heads * head * 2 + 2 * kv_heads * head * 2


def time_graphs(step: Callable[[int], None], n_sets: int, repeats: int) -> List[float]:
    """µs per call for each repeat of replaying graphs that visit every set."""
    n_calls = max(CALLS_PER_GRAPH, math.ceil(n_sets / CALLS_PER_GRAPH) * CALLS_PER_GRAPH)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(n_sets, 3)):
            step(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graphs = []
    for g in range(n_calls // CALLS_PER_GRAPH):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in range(CALLS_PER_GRAPH):
                step((g * CALLS_PER_GRAPH + c) % n_sets)
        graphs.append(graph)
    for graph in graphs:  # warm replay
        graph.replay()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for graph in graphs:
            graph.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1000.0 / n_calls)
    del graphs
    return out


def load_peer(peer_dir: Optional[str]):
    if not peer_dir:
        return None, "no --peer-dir"
    sys.path.insert(0, peer_dir)
    try:
        return importlib.import_module("sgl_fused_peer"), None
    except Exception as e:  # a missing or failed build: benchmark the rest
        return None, f"{type(e).__name__}: {e}"


def check_peer(peer) -> str:
    """Both fused kernels on the same inputs: the largest difference of q, k and the stored rows."""
    tokens, heads, kv_heads, head = 37, 32, 8, 128
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head, dtype=torch.bfloat16, device="cuda")
    ang = torch.rand(4096, head // 2, device="cuda", dtype=torch.float64) * 1000
    cache = torch.cat([ang.cos(), ang.sin()], -1).float()
    pos = torch.randint(0, 4096, (tokens,), device="cuda")
    loc = torch.randperm(100, device="cuda")[:tokens]
    bufs = torch.randn(2, 100, kv_heads, head, device="cuda").bfloat16()
    outs = []
    for run in ("ours", "peer"):
        x, b = qkv.clone(), bufs.clone()
        q, k, v = x.split([heads * head, kv_heads * head, kv_heads * head], -1)
        if run == "ours":
            torch.ops.rope_compat.rotary_embedding_set_kv(pos, q, k, head, cache, True, v, b[0], b[1], loc)
        else:
            peer.fused(q.view(tokens, heads, head), k.view(tokens, kv_heads, head), v.view(tokens, kv_heads, head),
                       b[0], b[1], cache, pos, loc, True)
        outs.append((x, b))
    dq = (outs[0][0].float() - outs[1][0].float()).abs().max().item()
    db = (outs[0][1].float() - outs[1][1].float()).abs().max().item()
    return f"max |ours - peer|: q/k/v {dq:.3g}, buffers {db:.3g}"


def bench_shape(name: str, tokens: int, peer, repeats: int) -> Dict[str, List[float]]:
    heads, kv_heads, head = SHAPES[name]
    qw, kw = heads * head, kv_heads * head
    per_set = tokens * ((qw + 2 * kw) * 2 + moved_bytes(heads, kv_heads, head) // 2 + 16) + tokens * head * 4
    n_sets = max(1, math.ceil(2.5 * l2_bytes() / per_set))
    # The KV cache is shared by the sets (one each would not fit at small sizes) and itself
    # larger than 2.5x the L2, so the rows a call writes are not in the L2 either.
    rows = max(2 * tokens, math.ceil(2.5 * l2_bytes() / (kw * 2)))
    ang = torch.rand(CACHE_ROWS, head // 2, device="cuda", dtype=torch.float64) * 1000
    cache = torch.cat([ang.cos(), ang.sin()], -1).float()
    bufs_bf16 = {k: torch.randn(rows, kv_heads, head, device="cuda").bfloat16() for k in ("k", "v")}
    bufs_fp8 = {k: torch.randn(rows, kv_heads, head, device="cuda").to(torch.float8_e4m3fn) for k in ("k", "v")}
    sets = [InputSet(tokens, heads, kv_heads, head, rows, bufs_bf16) for _ in range(n_sets)]
    one = torch.ones(1, device="cuda")
    op = torch.ops.rope_compat.rotary_embedding_set_kv

    def fused(i):
        s = sets[i]
        op(s.positions, s.q, s.k, head, cache, True, s.v, bufs_bf16["k"], bufs_bf16["v"], s.loc)

    def fused_fp8(i):
        s = sets[i]
        op(s.positions, s.q, s.k, head, cache, True, s.v, bufs_fp8["k"], bufs_fp8["v"], s.loc, 0.5, 0.25)

    def fused_scaled(i):
        s = sets[i]
        op(s.positions, s.q, s.k, head, cache, True, s.v, bufs_bf16["k"], bufs_bf16["v"], s.loc, 0.3, 0.7)

    def fused_fp8_odd(i):
        s = sets[i]
        op(s.positions, s.q, s.k, head, cache, True, s.v, bufs_fp8["k"], bufs_fp8["v"], s.loc, 0.3, 0.7)

    def launch_floor(i):
        one.mul_(1.0)

    def rope_copy(i):
        s = sets[i]
        rope_compat.rotary_embedding(s.positions, s.q, s.k, head, cache, True)
        bufs_bf16["k"].index_copy_(0, s.loc, s.k.view(tokens, kv_heads, head))
        bufs_bf16["v"].index_copy_(0, s.loc, s.v.view(tokens, kv_heads, head))

    def floor(i):
        sets[i].flat.mul_(1.0)

    impls = {"fused": fused, "fused-fp8": fused_fp8, "fused-scaled": fused_scaled, "fused-fp8-scaled": fused_fp8_odd,
             "rope+copy": rope_copy, "floor": floor, "one-element": launch_floor}
    if peer is not None:
        def sgl(i):
            s = sets[i]
            peer.fused(s.q.view(tokens, heads, head), s.k.view(tokens, kv_heads, head),
                       s.v.view(tokens, kv_heads, head), bufs_bf16["k"], bufs_bf16["v"], cache, s.positions,
                       s.loc, True)
        impls["sgl-kernel"] = sgl
    results = {k: time_graphs(f, n_sets, repeats) for k, f in impls.items()}
    del sets
    torch.cuda.empty_cache()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="1,16,128,1024,8192,32768")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--peer-dir", default=None)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    peer, why = load_peer(args.peer_dir)
    print(f"# {torch.cuda.get_device_name(0)}, L2 {l2_bytes() >> 20} MiB; rope_compat backend "
          f"{rope_compat.ops.extension.backend_for('cuda')}; sgl-kernel peer: {'loaded' if peer else why}")
    if peer is not None:
        print(f"# {check_peer(peer)}")
    print("| shape | tokens | impl | min us | median us | max us | median / fused median | GB/s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    summary = []
    for name in args.shapes.split(","):
        heads, kv_heads, head = SHAPES[name]
        for tokens in (int(t) for t in args.tokens.split(",")):
            res = bench_shape(name, tokens, peer, args.repeats)
            med = {impl: statistics.median(us) for impl, us in res.items()}
            gb = tokens * moved_bytes(heads, kv_heads, head) / 1e3
            for impl, us in res.items():
                print(f"| {name} | {tokens} | {impl} | {min(us):.2f} | {med[impl]:.2f} | {max(us):.2f} | "
                      f"{med[impl] / med['fused']:.2f}x | {gb / med[impl]:.0f} |", flush=True)
            summary.append((name, tokens, med))
    print("\n| shape | tokens | fused us | sgl-kernel / fused | fused as a fraction of the floor | fp8 / bf16 | "
          "fp8 scaled / bf16 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, tokens, med in summary:
        sgl = f"{med['sgl-kernel'] / med['fused']:.2f}x" if "sgl-kernel" in med else "-"
        print(f"| {name} | {tokens} | {med['fused']:.2f} | {sgl} | {med['floor'] / med['fused']:.2f} | "
              f"{med['fused-fp8'] / med['fused']:.2f}x | {med['fused-fp8-scaled'] / med['fused']:.2f}x |")


if __name__ == "__main__":
    main()
