"""Multimodal RoPE on a GPU: µs per call from CUDA-graph replays, rope_compat vs vLLM's Triton kernel.

Shapes (bf16, NeoX, q/k sliced from one fused qkv tensor, full rotation of 128-dim heads):
  qwen2.5-vl-7b   28/4x128, mrope_section [16, 24, 24], contiguous sections
  qwen3-vl-8b     32/8x128, mrope_section [24, 20, 20], interleaved sections
Positions are [3, T] int64, the three rows random and different over the whole cache
(--positions image: the temporal row random, height and width within 32 rows above it, as one
token of an image grid; --positions window: all three random among the first 16384 rows).
Columns:
  ours         rope_compat.mrope_rotary_embedding, float32 cache (the module's default)
  ours-bf16    the same with a bf16 cache (the cache dtype vLLM's layer uses)
  plain        rope_compat.rotary_embedding on the temporal row, same q/k, float32 cache:
               the target is ours <= 1.1x plain
  plain-bf16   the same with the bf16 cache (the ratio bf16/plain compares like with like)
  ours+kv      rope_compat.mrope_rotary_embedding_set_kv: the same rotation plus the key and
               value stored at random rows of bf16 KV buffers larger than 2.5x the L2
  plain+kv     rope_compat.rotary_embedding_set_kv on the temporal row, same inputs
  vllm-fwd     vLLM's MRotaryEmbedding.forward_cuda path: cache[positions] gather, chunk, then
               its Triton kernel triton_mrope (bf16 cache, as vLLM matches it to q's dtype) on
               the same strided q/k (which newer vLLM's launcher copies to contiguous ones)
  vllm-kernel  triton_mrope alone on cos/sin gathered beforehand and contiguous q/k (kernel
               time only)
vLLM's kernel is loaded from its own source file, `mrope.py` of vllm/model_executor/layers/
rotary_embedding, found in --peer-dir (kept out of this repository); only the few vLLM names
it imports are stubbed, since vLLM need not be installed. Without it (or if it fails to
import or run) those columns say why and the rest still runs.

Input sets together exceed 2.5x the L2 at every size (each call reads fresh inputs); graphs
hold 100 calls; each figure is the median over repeats of replaying every graph (min and max
are printed with --spread).
Usage: python benchmarks/mrope.py [--tokens 1,16,...] [--peer-dir DIR] [--shapes a,b] [--spread]
                                  [--columns ours,plain,...] [--positions random|image|window]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import traceback
import types
from typing import Callable, Dict, List, Optional

import torch

import rope_compat
from rope_compat.bench.timing import cuda_graph_us

CALLS_PER_GRAPH = 100
CACHE_ROWS = 262144
SHAPES = {
    "qwen2.5-vl-7b": (28, 4, 128, [16, 24, 24], False),
    "qwen3-vl-8b": (32, 8, 128, [24, 20, 20], True),
}
TOKENS = [1, 16, 128, 1024, 8192, 32768]
PEER_MODULE = "vllm.model_executor.layers.rotary_embedding.mrope"


def l2_bytes() -> int:
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20) or (60 << 20)


def load_vllm_mrope(peer_dir: str):
    """vLLM's mrope.py from `peer_dir`, with stubs for the vLLM names it imports."""
    path = os.path.join(peer_dir, "mrope.py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found (copy vllm/model_executor/layers/rotary_embedding/mrope.py there)")
    import triton
    import triton.language as tl

    def module(name: str, **attrs) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        m.__path__ = []  # a package, so that submodules resolve
        return m

    class _Platform:
        @staticmethod
        def is_rocm() -> bool:
            return False

    class _Base(torch.nn.Module):  # MRotaryEmbedding's base class; unused here
        pass

    stubs = {
        "vllm": module("vllm"),
        "vllm.platforms": module("vllm.platforms", current_platform=_Platform()),
        "vllm.triton_utils": module("vllm.triton_utils", tl=tl, triton=triton),
        # the same names where newer vLLM keeps them
        "vllm.backends": module("vllm.backends"),
        "vllm.backends.platform": module("vllm.backends.platform", current_platform=_Platform()),
        "vllm.backends.compute": module("vllm.backends.compute"),
        "vllm.backends.compute.dsl": module("vllm.backends.compute.dsl"),
        "vllm.backends.compute.dsl.triton_utils": module("vllm.backends.compute.dsl.triton_utils", tl=tl,
                                                         triton=triton),
        "vllm.utils": module("vllm.utils"),
        "vllm.utils.torch_utils": module("vllm.utils.torch_utils", direct_register_custom_op=lambda **kw: None),
        "vllm.model_executor": module("vllm.model_executor"),
        "vllm.model_executor.layers": module("vllm.model_executor.layers"),
        "vllm.model_executor.layers.rotary_embedding": module("vllm.model_executor.layers.rotary_embedding"),
        "vllm.model_executor.layers.rotary_embedding.base": module(
            "vllm.model_executor.layers.rotary_embedding.base", RotaryEmbeddingBase=_Base),
        "vllm.model_executor.layers.rotary_embedding.yarn_scaling_rope": module(
            "vllm.model_executor.layers.rotary_embedding.yarn_scaling_rope",
            YaRNScalingRotaryEmbedding=_Base, yarn_get_mscale=lambda *a, **k: 1.0),
    }
    saved = {name: sys.modules.get(name) for name in stubs}
    if PEER_MODULE in sys.modules:  # a real vLLM's module: put it back afterwards
        saved[PEER_MODULE] = sys.modules[PEER_MODULE]
    sys.modules.update(stubs)
    try:
        spec = importlib.util.spec_from_file_location(PEER_MODULE, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[PEER_MODULE] = mod
        spec.loader.exec_module(mod)
    finally:  # leave no stub behind (a real vLLM, if any, is unaffected); the peer stays
        # registered under its own name unless that name was taken, for Triton's sake
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return mod


POSITIONS = ["random", "image", "window"]
WINDOW_ROWS = 16384
GRID_SPAN = 32


def draw_positions(mode: str, tokens: int, gen: torch.Generator) -> torch.Tensor:
    """[3, T] cache rows: independent over the whole cache, or close together (see the docstring)."""
    if mode == "image":
        t = torch.randint(0, CACHE_ROWS - GRID_SPAN, (1, tokens), generator=gen)
        hw = torch.randint(0, GRID_SPAN, (2, tokens), generator=gen)
        return t + torch.cat([torch.zeros(1, tokens, dtype=torch.long), hw])
    return torch.randint(0, WINDOW_ROWS if mode == "window" else CACHE_ROWS, (3, tokens), generator=gen)


class InputSet:
    def __init__(self, tokens: int, heads: int, kv_heads: int, head: int, gen: torch.Generator, peer: bool,
                 kv_rows: int, positions: str = "random"):
        qw, kw = heads * head, kv_heads * head
        self.qkv = torch.randn(tokens, qw + 2 * kw, dtype=torch.bfloat16, device="cuda")
        self.q = self.qkv[:, :qw]
        self.k = self.qkv[:, qw : qw + kw]
        self.v = self.qkv[:, qw + kw :]
        self.positions = draw_positions(positions, tokens, gen).cuda()
        self.loc = torch.randint(0, kv_rows, (tokens,), generator=gen).cuda()
        self.cos = self.sin = None
        self.peer = peer

    def gather(self, cache_bf16: torch.Tensor) -> None:
        """What the kernel-only column starts from: cos/sin [3, T, rot_dim / 2] as vLLM's forward
        makes them, and contiguous copies of q and k (vLLM's launcher copies strided ones first)."""
        cos, sin = cache_bf16[self.positions].chunk(2, dim=-1)
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        self.qc, self.kc = self.q.contiguous(), self.k.contiguous()


def bytes_per_set(tokens: int, heads: int, kv_heads: int, head: int, peer: bool) -> int:
    qkv = tokens * (heads + 2 * kv_heads) * head * 2
    extra = (2 * 3 * tokens * (head // 2) * 2 + tokens * (heads + kv_heads) * head * 2) if peer else 0
    return qkv + 4 * tokens * 8 + extra


def run_shape(name: str, tokens_list: List[int], peer, peer_error: Optional[str], spread: bool,
              columns: List[str], positions: str) -> List[dict]:
    heads, kv_heads, head, sections, interleaved = SHAPES[name]
    rot = head
    cache = rope_compat.get_rope(head, CACHE_ROWS // 4, True, {"rope_theta": 1e6, "mrope_section": sections,
                                                               "mrope_interleaved": interleaved},
                                 torch.bfloat16).cos_sin_cache.cuda()
    assert cache.shape[0] == CACHE_ROWS and cache.dtype == torch.float32
    cache_bf16 = cache.to(torch.bfloat16)
    rows = []
    for tokens in tokens_list:
        gen = torch.Generator().manual_seed(tokens)
        per_set = bytes_per_set(tokens, heads, kv_heads, head, peer is not None)
        n_sets = max(1, math.floor(2.5 * l2_bytes() / per_set) + 1)
        # The KV buffers are shared by the sets and themselves larger than 2.5x the L2, so the
        # rows a call stores are not in the L2 either (as in fused_kv_store.py).
        kv_rows = max(2 * tokens, math.ceil(2.5 * l2_bytes() / (kv_heads * head * 2)))
        k_buf = v_buf = None
        if "ours+kv" in columns or "plain+kv" in columns:
            k_buf, v_buf = (torch.randn(kv_rows, kv_heads, head, device="cuda").bfloat16() for _ in range(2))
        sets = [InputSet(tokens, heads, kv_heads, head, gen, peer is not None, kv_rows, positions)
                for _ in range(n_sets)]
        if peer is not None:
            for s in sets:
                s.gather(cache_bf16)
        impls: Dict[str, Callable[[int], None]] = {
            "ours": lambda i: rope_compat.mrope_rotary_embedding(
                sets[i].positions, sets[i].q, sets[i].k, head, cache, True, sections, interleaved),
            "ours-bf16": lambda i: rope_compat.mrope_rotary_embedding(
                sets[i].positions, sets[i].q, sets[i].k, head, cache_bf16, True, sections, interleaved),
            "plain": lambda i: rope_compat.rotary_embedding(
                sets[i].positions[0], sets[i].q, sets[i].k, head, cache, True),
            "plain-bf16": lambda i: rope_compat.rotary_embedding(
                sets[i].positions[0], sets[i].q, sets[i].k, head, cache_bf16, True),
            "ours+kv": lambda i: rope_compat.mrope_rotary_embedding_set_kv(
                sets[i].positions, sets[i].q, sets[i].k, head, cache, True, sections, sets[i].v, k_buf, v_buf,
                sets[i].loc, mrope_interleaved=interleaved),
            "plain+kv": lambda i: rope_compat.rotary_embedding_set_kv(
                sets[i].positions[0], sets[i].q, sets[i].k, head, cache, True, sets[i].v, k_buf, v_buf,
                sets[i].loc),
        }
        if peer is not None:
            def vllm_fwd(i: int) -> None:
                s = sets[i]
                cos, sin = cache_bf16[s.positions].chunk(2, dim=-1)
                peer.triton_mrope(s.q, s.k, cos, sin, sections, head, rot, interleaved, True)

            impls["vllm-fwd"] = vllm_fwd
            impls["vllm-kernel"] = lambda i: peer.triton_mrope(
                sets[i].qc, sets[i].kc, sets[i].cos, sets[i].sin, sections, head, rot, interleaved, True)
        row = {"shape": name, "tokens": tokens, "sets": n_sets}
        for impl in columns:  # in the order given, so that a change of order can be timed
            if impl not in impls:
                continue
            step = impls[impl]
            try:
                t = cuda_graph_us(step, n_sets, calls_per_graph=CALLS_PER_GRAPH)
                row[impl] = t.median
                row[impl + "-spread"] = (t.min, t.max)
            except Exception as e:  # a failing implementation must not stop the others
                row[impl] = None
                row[impl + "-error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                print(f"  {name} T={tokens} {impl}: failed: {row[impl + '-error']}", file=sys.stderr)
        if peer is None:
            row["vllm-error"] = peer_error
        rows.append(row)
        print_row(row, spread)
        del sets, k_buf, v_buf
        torch.cuda.empty_cache()
    return rows


def check_against_peer(peer, name: str) -> str:
    """Max |ours - vLLM's kernel| on one input (bf16 cache for both): both compute the same thing."""
    heads, kv_heads, head, sections, interleaved = SHAPES[name]
    cache = rope_compat.get_rope(head, CACHE_ROWS // 4, True, {"rope_theta": 1e6, "mrope_section": sections},
                                 torch.bfloat16).cos_sin_cache.cuda().to(torch.bfloat16)
    s = InputSet(257, heads, kv_heads, head, torch.Generator().manual_seed(0), True, 257)
    s.gather(cache)
    q0 = s.q.clone()
    q1, k1 = s.q.clone(), s.k.clone()
    rope_compat.mrope_rotary_embedding(s.positions, q1, k1, head, cache, True, sections, interleaved)
    # vLLM's launcher rotates in place or returns rotated copies (of strided q/k): take what it returns.
    q2, k2 = peer.triton_mrope(s.qc, s.kc, s.cos, s.sin, sections, head, head, interleaved, True)
    changed = float((q1.float() - q0.float()).abs().max())
    diff = max(float((q1.float() - q2.float()).abs().max()), float((k1.float() - k2.float()).abs().max()))
    return f"{name}: max |ours - vLLM kernel| = {diff:.4g} (rotation moves values by up to {changed:.3g})"


COLUMNS = ["ours", "ours-bf16", "plain", "plain-bf16", "ours+kv", "plain+kv", "vllm-fwd", "vllm-kernel"]


def _fmt(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def print_header() -> None:
    cols = "".join(f"{c:>12}" for c in COLUMNS)
    print(f"{'shape':<14}{'tokens':>7}{cols}{'ours/plain':>12}{'bf16/plain':>12}{'kv/plain':>10}{'fwd/ours':>10}{'kern/ours':>10}")


def print_row(row: dict, spread: bool) -> None:
    cols = "".join(f"{_fmt(row.get(c)):>12}" for c in COLUMNS)
    print(f"{row['shape']:<14}{row['tokens']:>7}{cols}"
          f"{_ratio(row.get('ours'), row.get('plain')):>12}"
          f"{_ratio(row.get('ours-bf16'), row.get('plain-bf16')):>12}"
          f"{_ratio(row.get('ours+kv'), row.get('plain+kv')):>10}"
          f"{_ratio(row.get('vllm-fwd'), row.get('ours')):>10}"
          f"{_ratio(row.get('vllm-kernel'), row.get('ours')):>10}", flush=True)
    if spread:
        parts = [f"{c} {row[c + '-spread'][0]:.2f}..{row[c + '-spread'][1]:.2f}"
                 for c in COLUMNS if row.get(c + "-spread")]
        print(f"{'':<21}min..max: " + ", ".join(parts), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--peer-dir", default=None, help="folder holding vLLM's mrope.py")
    ap.add_argument("--spread", action="store_true", help="print min..max of every figure")
    ap.add_argument("--columns", default=",".join(COLUMNS), help="which columns to time, in this order (default: all)")
    ap.add_argument("--positions", default="random", choices=POSITIONS,
                    help="how a token's three cache rows are drawn (default: random, independent)")
    args = ap.parse_args(argv)
    columns = args.columns.split(",")
    if any(c not in COLUMNS for c in columns):
        ap.error(f"--columns: pick from {','.join(COLUMNS)}")
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    tokens = [int(t) for t in args.tokens.split(",")]
    shapes = args.shapes.split(",")
    print(f"device: {torch.cuda.get_device_name(0)}, L2 {l2_bytes() >> 20} MiB; "
          f"backend: {rope_compat.backend_for('cuda')}; torch {torch.__version__}")
    peer, peer_error = None, "no --peer-dir given"
    if args.peer_dir:
        try:
            peer = load_vllm_mrope(args.peer_dir)
            import triton
            print(f"vLLM's Triton MRoPE kernel from {args.peer_dir}/mrope.py (triton {triton.__version__})")
        except Exception as e:
            peer_error = f"vLLM's mrope.py did not import: {type(e).__name__}: {e}"
            print(peer_error, file=sys.stderr)
            traceback.print_exc()
    if peer is not None:
        for name in shapes:
            try:
                print(check_against_peer(peer, name))
            except Exception as e:
                print(f"{name}: cross-check with vLLM's kernel failed: {type(e).__name__}: {e}", file=sys.stderr)
    else:
        print(f"vLLM columns left out: {peer_error}")
    if args.positions != "random":
        print(f"positions: {args.positions}")
    print("µs per call (median over repeats of CUDA-graph replays, 100 calls per graph, inputs > 2.5x L2)")
    print_header()
    for name in shapes:
        run_shape(name, tokens, peer, peer_error, args.spread, columns, args.positions)
    print("bf16/plain: ours-bf16 / plain-bf16, the same ratio with bf16 caches")
    print("kv/plain: ours+kv / plain+kv, the same ratio with the KV store fused")
    print("targets: ours/plain <= 1.1; fwd/ours (vLLM's call) >= 1.5 at 1-128 tokens, >= 1.2 from 8192")
    return 0


if __name__ == "__main__":
    sys.exit(main())
