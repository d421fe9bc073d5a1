"""Large calls on the GPU: the kernel's many-heads-per-thread path and its launch splitting.

Small cases (the rest of the suite) run one head per thread; calls of at least 8 units of work
per thread the GPU holds at once (see heads_per_thread() in csrc/kernel_common.cuh: about 6800
tokens of 32/8x128 on an H200, 16900 of 16/16x256 rot64) run several heads per thread in
batches. These cases reach that path with model shapes (and, at 8192 tokens, one head per thread
in calls of that size) and compare sampled tokens with the float64 reference, and the whole
tensors with the Torch implementation on the same device.
"""

import pytest
import torch

import rope_compat
from cases import bits, random_cache
from reference import rope_reference
from rope_compat.ops import kv_store, torch_impl
from tolerances import assert_matches_reference

pytestmark = pytest.mark.gpu

SHAPES = {  # heads, kv_heads, head_size, rot_dim, is_neox
    "llama3-8b": (32, 8, 128, 128, True),
    "partial-rotary": (32, 32, 128, 64, True),
    "gptj": (16, 16, 256, 64, False),
    "odd": (12, 4, 80, 48, True),
}


def widest_vector(dtype: torch.dtype, *sizes: int) -> int:
    """The widest vector (16 bytes at most) dividing every size: at least the kernel's V, so units
    counted with it are never overcounted."""
    v = 16 // torch.empty((), dtype=dtype).element_size()
    while v > 1 and any(size % v for size in sizes):
        v //= 2
    return v


def threshold_tokens(units_per_token: int, at_least: int = 1) -> int:
    """A token count (at least `at_least`) past the kernels' several-heads threshold on this GPU,
    with a 25% margin: launch() takes that path from 8 units (threads at one head each) per
    resident thread (2048 per SM)."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    needed = -(-8 * sms * 2048 // units_per_token)
    return max(at_least, needed + needed // 4)


def several_heads_tokens(heads_total: int, rot_dim: int, offset: int, dtype: torch.dtype, at_least: int) -> int:
    """Tokens that put a rotation call on the several-heads path; a unit is one vector of V
    elements of each half of one head's rotated dims."""
    half = rot_dim // 2
    return threshold_tokens(heads_total * (half // widest_vector(dtype, half, offset)), at_least)


def check_fused_call(positions, qkv, before, hq, hk, d, cache, neox, offset=0, with_key=True):
    """After the op rotated the q (and k) slices of the fused `qkv` (a copy of `before`): the
    whole tensor against the Torch implementation on another copy (same float32 math, so at
    most one rounding apart), 64 sampled tokens against the float64 reference, and everything
    outside the rotated dims of the rotated heads bit-identical to `before`."""

    def q_of(t):
        return t[:, : hq * d]

    def k_of(t):
        return t[:, hq * d : (hq + hk) * d] if with_key else None

    expected = before.clone()
    torch_impl.rotary_embedding(positions, q_of(expected), k_of(expected), d, cache, neox, offset)
    assert_matches_reference(qkv, expected, "whole fused tensor vs the Torch implementation")
    idx = torch.randint(0, qkv.shape[0], (64,), device=qkv.device)
    rq, rk = rope_reference(positions[idx], q_of(before[idx]), k_of(before[idx]), d, cache, neox, offset)
    assert_matches_reference(q_of(qkv)[idx], rq, "query")
    if with_key:
        assert_matches_reference(k_of(qkv)[idx], rk, "key")
    # Pass-through dims of the rotated heads, and the heads not rotated (v; k without a key).
    n = (hq + hk) * d if with_key else hq * d
    heads, heads_before = (t[:, :n].unflatten(-1, (-1, d)) for t in (qkv, before))
    end = offset + cache.shape[1]
    assert torch.equal(heads[..., :offset], heads_before[..., :offset])
    assert torch.equal(heads[..., end:], heads_before[..., end:])
    assert torch.equal(qkv[:, n:], before[:, n:])


@pytest.mark.parametrize("tokens", [8192, 65536])
@pytest.mark.parametrize("shape", SHAPES)
def test_large_call_matches_reference(shape, tokens):
    hq, hk, d, rot, neox = SHAPES[shape]
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, dtype=torch.bfloat16, device="cuda")
    q, k = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d]
    cache = random_cache(131072, rot, torch.float32, "cuda")
    positions = torch.randint(0, cache.shape[0], (tokens,), device="cuda")
    before = qkv.clone()

    rope_compat.rotary_embedding(positions, q, k, d, cache, neox)

    check_fused_call(positions, qkv, before, hq, hk, d, cache, neox)


@pytest.mark.parametrize("shape", ["llama3-8b", "gptj"])
def test_large_call_inverse_int32_bf16_cache_out_of_range(shape):
    """The large-call path with the other options: inverse, int32 positions, a bf16 cache, and
    positions outside the cache (those tokens stay bit-identical; the rest rotate)."""
    hq, hk, d, rot, neox = SHAPES[shape]
    tokens, rows = several_heads_tokens(hq + hk, rot, 0, torch.bfloat16, 8192), 4096
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, dtype=torch.bfloat16, device="cuda")
    q, k = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d]
    cache = random_cache(rows, rot, torch.bfloat16, "cuda")
    positions = torch.randint(0, rows, (tokens,), device="cuda", dtype=torch.int32)
    bad = torch.zeros(tokens, dtype=torch.bool, device="cuda")
    bad[torch.randint(0, tokens, (300,), device="cuda")] = True
    positions[bad] = torch.tensor([-1, rows, 2**31 - 1], device="cuda", dtype=torch.int32).repeat(tokens)[: tokens][bad]
    before = qkv.clone()

    rope_compat.rotary_embedding(positions, q, k, d, cache, neox, 0, True)

    assert torch.equal(qkv[bad], before[bad])
    good = ~bad
    expected = before[good].clone()
    torch_impl.rotary_embedding(positions[good], expected[:, : hq * d], expected[:, hq * d : (hq + hk) * d], d,
                                cache, neox, 0, True)
    assert_matches_reference(qkv[good], expected, "valid tokens vs the Torch implementation")
    assert not torch.equal(qkv[good], before[good])


# GPT-J in large calls pairs vector j of each half of the rotated dims (the kernel's comment says
# why), so each vector width, each cache dtype, rope_dim_offset and key=None get a case there:
# (dtype, cache dtype, heads, kv_heads, head_size, rot_dim, rope_dim_offset, with_key). Token
# counts come from several_heads_tokens.
GPTJ_LARGE = {
    "f32-v4-f64-cache": (torch.float32, torch.float64, 16, 16, 256, 64, 0, True),
    "bf16-v2-offset-f16-cache": (torch.bfloat16, torch.float16, 8, 8, 64, 12, 4, True),
    "f16-v8-offset-no-key": (torch.float16, torch.float32, 32, 4, 128, 32, 64, False),
    "bf16-v8-bf16-cache": (torch.bfloat16, torch.bfloat16, 16, 16, 256, 64, 0, True),
}


@pytest.mark.parametrize("case", GPTJ_LARGE)
def test_large_call_gptj_widths(case):
    dtype, cache_dtype, hq, hk, d, rot, offset, with_key = GPTJ_LARGE[case]
    tokens = several_heads_tokens(hq + (hk if with_key else 0), rot, offset, dtype, 16384)
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, dtype=dtype, device="cuda")
    q = qkv[:, : hq * d]
    k = qkv[:, hq * d : (hq + hk) * d] if with_key else None
    cache = random_cache(131072, rot, cache_dtype, "cuda")
    positions = torch.randint(0, cache.shape[0], (tokens,), device="cuda")
    before = qkv.clone()

    rope_compat.rotary_embedding(positions, q, k, d, cache, False, offset)

    check_fused_call(positions, qkv, before, hq, hk, d, cache, False, offset, with_key)
    assert not torch.equal(qkv, before)


# rotary_embedding_set_kv in large calls: several heads per thread for the rotation and for the
# value (set_kv_grouped_kernel in csrc/fused_kv_store_kernel.cu), from the same threshold in
# threads at one head each; float8 buffers stay at one head per thread in calls that size (the
# two float8 cases). (dtype, buffer dtype, cache dtype, heads, kv_heads, head_size, rot_dim,
# rope_dim_offset, is_neox, k_scale, v_scale, cache_loc dtype).
SET_KV_LARGE = {
    "llama3-8b-bf16": (torch.bfloat16, torch.bfloat16, torch.float32, 32, 8, 128, 128, 0, True, None, None, torch.int64),
    "64/8-fp8-scaled": (torch.bfloat16, torch.float8_e4m3fn, torch.float32, 64, 8, 128, 128, 0, True, 0.3, 0.7,
                        torch.int32),
    "gptj-partial-offset-f16": (torch.float16, torch.float32, torch.bfloat16, 16, 4, 128, 64, 32, False, None, 2.0,
                                torch.int64),
    "odd-heads-e5m2": (torch.bfloat16, torch.float8_e5m2, torch.float16, 12, 4, 80, 48, 8, True, 0.5, None,
                       torch.int64),
    "f32-mqa": (torch.float32, torch.bfloat16, torch.float64, 28, 1, 64, 64, 0, True, None, None, torch.int32),
    "qwen2.5-7b-gqa": (torch.bfloat16, torch.float16, torch.float32, 28, 4, 128, 128, 0, False, 1.5, 0.5, torch.int64),
}


def set_kv_grouped_tokens(hq: int, hk: int, d: int, rot: int, dtype: torch.dtype) -> int:
    """Tokens past the same threshold for a set_kv call, whose units are a token's rotation,
    pass-through and value vectors (one head each)."""
    v = widest_vector(dtype, rot // 2, d, rot)
    return threshold_tokens((hq + hk) * (rot // 2 // v) + hk * ((d - rot) // v) + hk * (d // v))


@pytest.mark.parametrize("case", SET_KV_LARGE)
def test_large_set_kv_call(case):
    """The whole call against the Torch implementation: q/k at most one rounding apart, and the
    buffers bit for bit as that implementation stores the kernel's own rotated key and the value
    (poisoned rows not named stay as they were); sampled tokens against the float64 reference.
    Some tokens name no row (-1, past the end) and some positions lie outside the cache."""
    dtype, buf_dtype, cache_dtype, hq, hk, d, rot, offset, neox, k_scale, v_scale, loc_dtype = SET_KV_LARGE[case]
    tokens = set_kv_grouped_tokens(hq, hk, d, rot, dtype)
    qkv = torch.randn(tokens, (hq + 2 * hk) * d + 8, dtype=dtype, device="cuda")
    q = qkv[:, : hq * d]
    k = qkv[:, hq * d : (hq + hk) * d].unflatten(-1, (hk, d))
    v = qkv[:, (hq + hk) * d : (hq + 2 * hk) * d]
    cache = random_cache(8192, rot, cache_dtype, "cuda")
    positions = torch.randint(0, cache.shape[0], (tokens,), device="cuda")
    positions[torch.randint(0, tokens, (50,), device="cuda")] = cache.shape[0]  # not rotated, still stored
    rows = 2 * tokens + 5
    loc = torch.randperm(rows, device="cuda")[:tokens]
    loc[torch.randint(0, tokens, (50,), device="cuda")] = -1
    loc[torch.randint(0, tokens, (50,), device="cuda")] = rows
    loc = loc.to(loc_dtype)
    k_buf = torch.randn(rows, hk, d, device="cuda").to(buf_dtype)
    v_buf = torch.randn(rows, hk * d, device="cuda").to(buf_dtype)
    before = qkv.clone()
    k_buf0, v_buf0 = k_buf.clone(), v_buf.clone()

    rope_compat.rotary_embedding_set_kv(positions, q, k, d, cache, neox, v, k_buf, v_buf, loc, k_scale, v_scale,
                                        rope_dim_offset=offset)

    expected = before.clone()
    eq, ek = expected[:, : hq * d], expected[:, hq * d : (hq + hk) * d]
    kv_store.rotary_embedding_set_kv(positions, eq, ek, d, cache, neox, expected[:, (hq + hk) * d : (hq + 2 * hk) * d],
                                     k_buf0.clone(), v_buf0.clone(), loc, k_scale, v_scale, offset)
    assert_matches_reference(qkv, expected, "whole fused tensor vs the Torch implementation")
    in_cache = positions < cache.shape[0]
    idx = in_cache.nonzero().squeeze(1)[torch.randint(0, int(in_cache.sum()), (64,), device="cuda")]
    rq, rk = rope_reference(positions[idx], before[idx, : hq * d], before[idx, hq * d : (hq + hk) * d], d, cache,
                            neox, offset)
    assert_matches_reference(q[idx], rq, "query")
    assert_matches_reference(k[idx].flatten(1), rk, "key")
    assert torch.equal(qkv[~in_cache], before[~in_cache])
    # The buffers: what the Torch store makes of the kernel's own rotated key and the value, on
    # the CPU, whose division by a scale is correctly rounded like the kernel's (torch on CUDA
    # multiplies by the reciprocal, which can round a float8 value the other way).
    cpu = [t.cpu() for t in (positions, q, k, cache, v, loc)]
    want_k, want_v = k_buf0.cpu().clone(), v_buf0.cpu().clone()
    layouts = kv_store.check_kv_store_args(cpu[0], cpu[1], cpu[2], d, cpu[3], cpu[4], want_k, want_v, cpu[5], k_scale,
                                           v_scale, offset)
    kv_store.store_key_value(cpu[2], cpu[4], want_k, want_v, layouts, cpu[5], k_scale, v_scale, d)
    assert torch.equal(bits(k_buf), bits(want_k)), "k_buffer"
    assert torch.equal(bits(v_buf), bits(want_v)), "v_buffer"
    assert not torch.equal(bits(k_buf), bits(k_buf0))
