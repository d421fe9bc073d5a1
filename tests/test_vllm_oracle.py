"""rope_compat against vLLM's real CPU kernel, on identical inputs.

Skipped unless vLLM's compiled ops import (`vllm._custom_ops`). The comparison covers what
vLLM's CPU kernel supports: flat [..., H * D] layouts, cache dtype equal to q's, no
rope_dim_offset and no inverse. bf16 NeoX with rot_dim / 2 not a multiple of 8 crashes it
(SIGSEGV): those shapes run vLLM's side in a subprocess (test_shapes_that_crash_vllm), so that
its crash marks only its own row, and ours is checked against float64 there.

Tolerance: one ulp of the dtype at the magnitude of the rotated pair, sqrt(x^2 + y^2).
Both compute x*c - y*s and y*c + x*s in float32 and round once, but may round the two f32
products and their sum in a different order (or fuse them). That moves the f32 result by
about an f32 ulp of the products, which are bounded by the pair's magnitude: in float32
that is visible when x*c and y*s nearly cancel (so an ulp of the result itself would be too
strict); in f16/bf16 it can at most flip the final rounding, one ulp of a value no larger
than the pair's magnitude.
"""

import signal
import subprocess
import sys

import pytest
import torch

import rope_compat
from cases import make_case
from reference import rope_reference
from tolerances import assert_matches_reference
from vllm_env import vllm_importable

if not vllm_importable():
    pytest.skip("needs vLLM's compiled ops", allow_module_level=True)
import vllm._custom_ops as vllm_ops  # noqa: E402
pytestmark = pytest.mark.vllm

MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}


def _pair_magnitude(x: torch.Tensor, head_size: int, rot_dim: int, is_neox: bool) -> torch.Tensor:
    """Per element of the rotated dims: the norm of the pair it belongs to, [..., H, rot_dim]."""
    part = x.double().unflatten(-1, (-1, head_size))[..., :rot_dim]
    half = rot_dim // 2
    if is_neox:
        a, b = part[..., :half], part[..., half:]
        r = (a * a + b * b).sqrt()
        return torch.cat([r, r], -1)
    a, b = part[..., 0::2], part[..., 1::2]
    return (a * a + b * b).sqrt().repeat_interleave(2, -1)


def _ulp(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One ulp of `dtype` at `magnitude` (float64), floored at the smallest normal's ulp."""
    tiny = torch.finfo(dtype).tiny
    _, exponent = torch.frexp(magnitude.clamp_min(tiny))
    return torch.ldexp(torch.ones_like(magnitude), exponent - 1 - MANTISSA_BITS[dtype])


def assert_within_one_ulp(ours, theirs, original, head_size, rot_dim, is_neox):
    ours_h = ours.double().unflatten(-1, (-1, head_size))
    theirs_h = theirs.double().unflatten(-1, (-1, head_size))
    # Pass-through dims: both leave them alone.
    assert torch.equal(ours_h[..., rot_dim:], theirs_h[..., rot_dim:])
    diff = (ours_h[..., :rot_dim] - theirs_h[..., :rot_dim]).abs()
    allowed = _ulp(_pair_magnitude(original, head_size, rot_dim, is_neox), ours.dtype)
    worst = float((diff / allowed).max())
    assert worst <= 1.0, f"differs from vLLM by {worst:.2f} ulp at the pair magnitude"


def _crashes_vllm(dtype: torch.dtype, is_neox: bool, rot_dim: int) -> bool:
    return dtype == torch.bfloat16 and is_neox and (rot_dim // 2) % 8 != 0


CASES = {
    "mha_full": dict(heads=4, kv_heads=4, head_size=64),
    "gqa_full": dict(heads=8, kv_heads=2, head_size=128),
    "mqa_full": dict(heads=8, kv_heads=1, head_size=64),
    "partial_half": dict(heads=4, kv_heads=2, head_size=128, rot_dim=64),
    "partial_quarter": dict(heads=4, kv_heads=2, head_size=64, rot_dim=16),
    "partial_odd_pairs": dict(heads=4, kv_heads=2, head_size=80, rot_dim=20),
    "head_96": dict(heads=6, kv_heads=2, head_size=96),
}


@pytest.mark.parametrize("tokens", [(1,), (3, 5)], ids=["1", "3x5"])
@pytest.mark.parametrize("layout", ["flat", "fused_flat"])
@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no_key"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", CASES)
def test_matches_vllm_cpu_kernel(name, dtype, is_neox, with_key, layout, tokens):
    shape = CASES[name]
    rot_dim = shape.get("rot_dim", shape["head_size"])
    if _crashes_vllm(dtype, is_neox, rot_dim):
        pytest.skip("vLLM's CPU kernel crashes here: test_shapes_that_crash_vllm runs it in a subprocess")
    case = make_case(
        tokens=tokens, is_neox=is_neox, dtype=dtype, cache_dtype=dtype, layout=layout,
        with_key=with_key, cache_rows=512, **shape,
    )
    q_theirs = case.query.clone()
    k_theirs = None if case.key is None else case.key.clone()
    q0 = case.query.clone()
    k0 = None if case.key is None else case.key.clone()

    vllm_ops.rotary_embedding(case.positions, q_theirs, k_theirs, case.head_size, case.cos_sin_cache, is_neox)
    rope_compat.rotary_embedding(case.positions, case.query, case.key, case.head_size, case.cos_sin_cache, is_neox)

    assert_within_one_ulp(case.query, q_theirs, q0, case.head_size, rot_dim, is_neox)
    if with_key:
        assert_within_one_ulp(case.key, k_theirs, k0, case.head_size, rot_dim, is_neox)


_VLLM_IN_SUBPROCESS = """
import sys, torch
import vllm._custom_ops as ops
a = torch.load(sys.argv[1])
ops.rotary_embedding(a["positions"], a["query"], a["key"], a["head_size"], a["cache"], a["is_neox"])
torch.save({"query": a["query"], "key": a["key"]}, sys.argv[2])
"""


@pytest.mark.parametrize("rot_dim", [20, 24, 40])
def test_shapes_that_crash_vllm(rot_dim, tmp_path):
    """bf16 NeoX, rot_dim / 2 not a multiple of 8: vLLM's side in a subprocess. Ours must match
    float64; vLLM's within one ulp if it survives, else the row is an expected failure."""
    head_size, dtype = rot_dim + 16, torch.bfloat16
    assert _crashes_vllm(dtype, True, rot_dim)
    case = make_case(tokens=(3, 5), heads=4, kv_heads=2, head_size=head_size, rot_dim=rot_dim, dtype=dtype,
                     cache_dtype=dtype, cache_rows=512)
    q0, k0 = case.query.clone(), case.key.clone()
    torch.save({"positions": case.positions, "query": q0.clone(), "key": k0.clone(), "head_size": head_size,
                "cache": case.cos_sin_cache, "is_neox": True}, tmp_path / "in.pt")
    theirs = subprocess.run([sys.executable, "-c", _VLLM_IN_SUBPROCESS, str(tmp_path / "in.pt"),
                             str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=300)

    rope_compat.rotary_embedding(case.positions, case.query, case.key, head_size, case.cos_sin_cache, True)
    want_q, want_k = rope_reference(case.positions, q0, k0, head_size, case.cos_sin_cache, True)
    assert_matches_reference(case.query, want_q, "query vs float64")
    assert_matches_reference(case.key, want_k, "key vs float64")
    if theirs.returncode < 0:
        pytest.xfail(f"vLLM crashes ({signal.Signals(-theirs.returncode).name}); ours vs float64 passes")
    assert theirs.returncode == 0, f"vLLM's subprocess failed:\n{theirs.stderr[-3000:]}"
    out = torch.load(tmp_path / "out.pt")
    assert_within_one_ulp(case.query, out["query"], q0, head_size, rot_dim, True)
    assert_within_one_ulp(case.key, out["key"], k0, head_size, rot_dim, True)


def test_schema_matches_vllm():
    """Argument names, types, defaults and which arguments are written."""
    import rope_compat.ops  # noqa: F401  (registers the op)

    def signature(op):
        return [
            (a.name, str(a.type), a.default_value, a.alias_info is not None and a.alias_info.is_write)
            for a in op._schema.arguments
        ]

    assert signature(torch.ops.rope_compat.rotary_embedding.default) == signature(
        torch.ops._C.rotary_embedding.default
    )
