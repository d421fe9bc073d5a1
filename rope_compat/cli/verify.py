"""`rope-compat verify`: check rope-compat (and any installed peer) against a float64 reference.

A compact sweep over dtypes, cache dtypes, NeoX/GPT-J, full/partial/offset rotation, inverse,
1-D and 2-D positions, with and without key, and the four layouts the op accepts (flat or
per-head, standalone or sliced from a fused qkv tensor), on every available device. Every
case checks three things: the rotated values are within one ulp-ish tolerance of the
reference, the pass-through dims are bit-identical, and nothing outside q and k (the rest of
the fused qkv tensor) was written.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from ..bench.external import CallInfo, installed_externals
from ..tolerances import rtol_atol
from .reference import rope_reference


DTYPES = (  # (q/k dtype, cache dtype): q's own dtype (vLLM's habit) and float32 (FlashInfer's)
    (torch.float32, torch.float32),
    (torch.float16, torch.float16),
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float32),
)
LAYOUTS = ("flat", "heads", "fused_flat", "fused_heads")


class Geometry(NamedTuple):
    name: str
    tokens: Tuple[int, ...]
    heads: int
    kv_heads: int  # 0: no key
    head_size: int
    rot_dim: int
    offset: int = 0
    inverse: bool = False
    pos_dtype: torch.dtype = torch.int64


GEOMETRIES = (
    Geometry("full", (37,), 4, 2, 64, 64),
    Geometry("partial,2d-pos", (3, 11), 4, 4, 128, 32, pos_dtype=torch.int32),
    Geometry("offset,inverse", (37,), 2, 1, 96, 32, offset=32, inverse=True, pos_dtype=torch.int32),
    Geometry("no-key", (19,), 3, 0, 64, 48),
)
CACHE_ROWS = 512  # positions span all of it; small keeps the sweep quick

_SHORT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Case:
    geometry: Geometry
    dtype: torch.dtype
    cache_dtype: torch.dtype
    is_neox: bool
    layout: str

    def label(self) -> str:
        g = self.geometry
        return (
            f"{_SHORT[self.dtype]}/{_SHORT[self.cache_dtype]} {'neox' if self.is_neox else 'gptj'} "
            f"{g.name} {g.heads}/{g.kv_heads}x{g.head_size} rot{g.rot_dim} {self.layout}"
        )

    def call_info(self, device: str) -> CallInfo:
        g = self.geometry
        return CallInfo(
            device, self.layout.endswith("flat"), self.dtype, self.cache_dtype, g.rot_dim,
            self.is_neox, g.offset, g.inverse, len(g.tokens) == 1, g.kv_heads > 0,
        )


def cases() -> List[Case]:
    return [
        Case(g, dt, cdt, neox, layout)
        for g, (dt, cdt), neox, layout in itertools.product(GEOMETRIES, DTYPES, (True, False), LAYOUTS)
    ]


class Inputs(NamedTuple):
    args: tuple  # the op's arguments
    base: Optional[torch.Tensor]  # the fused qkv tensor q and k are sliced from, if any
    k_end: int  # q and k fill [0, k_end) of base's last dim


def build(case: Case, device: str, gen: torch.Generator) -> Inputs:
    """Fresh random inputs; q/k either standalone or sliced from a padded fused qkv tensor."""
    g = case.geometry
    qw, kw = g.heads * g.head_size, g.kv_heads * g.head_size
    fused = case.layout.startswith("fused")
    width = qw + 2 * kw + 8 if fused else qw + kw  # fused: q | k | v | padding
    base = torch.randn(*g.tokens, width, generator=gen, dtype=torch.float32).to(case.dtype)
    base = base.to(device)
    q, k = base[..., :qw], base[..., qw : qw + kw]
    if not fused:  # standalone contiguous tensors
        q, k = q.clone(), k.clone()
    if case.layout.endswith("heads"):
        q = q.unflatten(-1, (g.heads, g.head_size))
        k = k.unflatten(-1, (g.kv_heads, g.head_size)) if g.kv_heads else k
    key = k if g.kv_heads else None
    positions = torch.randint(0, CACHE_ROWS, g.tokens, generator=gen, dtype=torch.int64)
    angles = torch.rand(CACHE_ROWS, g.rot_dim // 2, generator=gen, dtype=torch.float64) * 1000.0
    cache = torch.cat([angles.cos(), angles.sin()], -1).to(case.cache_dtype)
    args = (
        positions.to(g.pos_dtype).to(device), q, key, g.head_size, cache.to(device),
        case.is_neox, g.offset, g.inverse,
    )
    return Inputs(args, base if fused else None, qw + kw)


class Outcome(NamedTuple):
    ok: bool
    err_over_tol: float  # worst |actual - ref| / (atol + rtol |ref|); <= 1 passes
    max_abs_err: float
    note: str = ""


def _compare(case: Case, before: Inputs, after_q, after_k, ref_q, ref_k, base_before) -> Outcome:
    g = case.geometry
    rtol, atol = rtol_atol(case.dtype)
    worst, max_abs, notes = 0.0, 0.0, []
    rotated = torch.zeros(g.head_size, dtype=torch.bool)
    rotated[g.offset : g.offset + g.rot_dim] = True
    for name, x, x0, ref in (("query", after_q, before.args[1], ref_q), ("key", after_k, before.args[2], ref_k)):
        if ref is None:
            continue
        heads = x.double().cpu().reshape(-1, g.head_size)
        err = (heads - ref.reshape(-1, g.head_size)).abs()
        worst = max(worst, (err / (atol + rtol * ref.reshape(-1, g.head_size).abs())).max().item())
        max_abs = max(max_abs, err.max().item())
        # Pass-through dims must come back bit for bit.
        kept = x.cpu().reshape(-1, g.head_size)[:, ~rotated]
        if not torch.equal(kept, x0.cpu().reshape(-1, g.head_size)[:, ~rotated]):
            notes.append(f"{name} pass-through dims changed")
    if base_before is not None:
        k_end = before.k_end  # q and k fill [0, k_end) of each fused row
        if not torch.equal(base_before[..., k_end:], before.base[..., k_end:].cpu()):
            notes.append("wrote outside q and k (v / padding of qkv)")
    return Outcome(worst <= 1.0 and not notes, worst, max_abs, "; ".join(notes))


def run_case(case: Case, device: str, fn: Callable[..., None], seed: int) -> Outcome:
    """Run `fn` (rotary_embedding's signature, in place) on one case; compare; never raise."""
    gen = torch.Generator().manual_seed(seed)
    inputs = build(case, device, gen)
    positions, q, k, head_size, cache, is_neox, offset, inverse = inputs.args
    ref_q, ref_k = rope_reference(positions, q, k, head_size, cache, is_neox, offset, inverse)
    q0, k0 = q.clone(), None if k is None else k.clone()
    base_before = None if inputs.base is None else inputs.base.cpu().clone()
    try:
        fn(*inputs.args)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # an implementation that raises fails the case, it does not stop the run
        return Outcome(False, float("inf"), float("inf"), f"raised {type(e).__name__}: {e}".splitlines()[0])
    before = Inputs((positions, q0, k0, *inputs.args[3:]), inputs.base, inputs.k_end)
    return _compare(case, before, q, k, ref_q, ref_k, base_before)


def load_impl(spec: str) -> Callable[..., None]:
    """'module:function' -> the function (for checking another implementation of the op)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"--impl: expected 'module:function', got {spec!r}")
    return getattr(importlib.import_module(module), name)


class Row(NamedTuple):
    device: str
    case: Case
    results: Dict[str, Optional[Outcome]]  # implementation -> outcome (None: not supported)


def available_devices() -> List[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def verify(
    impl: Optional[Callable[..., None]] = None,
    devices: Optional[Sequence[str]] = None,
    with_externals: bool = True,
    seed: int = 0,
) -> Tuple[List[Row], Dict[str, str]]:
    """Run the sweep; returns the rows and, per external, why some cases were skipped."""
    if impl is None:
        from ..api import rotary_embedding as impl
    loaded, notes = {}, {}
    for ext in installed_externals() if with_externals else []:
        try:
            loaded[ext.name] = (ext, ext.load())
        except Exception as e:  # installed but unusable (no GPU runtime, ABI mismatch, ...)
            notes[ext.name] = f"import failed: {type(e).__name__}: {e}".splitlines()[0]
    rows, skipped = [], {}
    for device in devices or available_devices():
        for i, case in enumerate(cases()):
            results = {"rope-compat": run_case(case, device, impl, seed + i)}
            for name, (ext, fn) in loaded.items():
                why = ext.unsupported(case.call_info(device))
                if why is None:
                    results[name] = run_case(case, device, fn, seed + i)
                else:
                    results[name] = None
                    skipped.setdefault(name, set()).add(why)
            rows.append(Row(device, case, results))
    for name, reasons in skipped.items():
        notes[name] = "cases it does not support were skipped: " + "; ".join(sorted(reasons))
    return rows, notes


def _cell(o: Optional[Outcome]) -> str:
    if o is None:
        return "-"
    return f"{'ok' if o.ok else 'FAIL'} {o.err_over_tol:.2f}"


def format_table(rows: List[Row], notes: Dict[str, str]) -> str:
    impls = list(dict.fromkeys(k for r in rows for k in r.results))
    header = ["device", "case", "max |err|", *[f"{n} err/tol" for n in impls], "result"]
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    for r in rows:
        ours = r.results["rope-compat"]
        cells = [r.device, r.case.label(), f"{ours.max_abs_err:.1e}"]
        cells += [_cell(r.results.get(n)) for n in impls]
        cells.append("PASS" if ours.ok else f"FAIL {ours.note}".strip())
        lines.append(" | ".join(cells))
        for name, o in r.results.items():
            if name != "rope-compat" and o is not None and o.note:
                lines.append(f"  ({name}: {o.note})")
    failed = sum(not r.results["rope-compat"].ok for r in rows)
    lines.append("")
    lines.append(
        "err/tol: worst |actual - float64 reference| / (atol + rtol*|reference|); a case passes "
        "at <= 1 with pass-through dims and the rest of qkv unchanged."
    )
    for name, note in notes.items():
        lines.append(f"{name}: {note}")
    for name in impls[1:]:
        bad = sum(1 for r in rows if r.results.get(name) is not None and not r.results[name].ok)
        ran = sum(1 for r in rows if r.results.get(name) is not None)
        lines.append(f"{name}: {ran - bad}/{ran} cases within tolerance")
    lines.append(f"rope-compat: {len(rows) - failed}/{len(rows)} cases PASS" + (f", {failed} FAIL" if failed else ""))
    return "\n".join(lines)


def main(args) -> int:
    if args.device and "cuda" in args.device and not torch.cuda.is_available():
        print("verify: --device cuda, but no CUDA device is available", file=sys.stderr)
        return 2
    impl = load_impl(args.impl) if args.impl else None
    rows, notes = verify(impl, args.device, with_externals=not args.no_external, seed=args.seed)
    print(format_table(rows, notes))
    # The exit status judges rope-compat (or --impl); peers' deviations are reported only.
    return 0 if all(r.results["rope-compat"].ok for r in rows) else 1
