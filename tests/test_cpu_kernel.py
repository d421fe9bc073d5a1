"""The CPU paths where the compiled CPU kernel (csrc/cpu_ops.cpp) has code of its own.

Every test calls the public functions, so it checks whichever implementation serves the CPU
(the compiled kernel, or the Torch implementation with ROPE_COMPAT_DISABLE_CPU_KERNEL=1); the
cases are the kernel's: work split across threads in the middle of a token, vector tails of
every length, cache rows converted in segments, the parallel bounds pass. Whole fused
tensors (q | k | v | padding) are compared, so a write outside the rotated dims is seen.
"""

import pytest
import torch

import rope_compat
from cases import random_cache
from reference import rope_reference
from rope_compat.ops import extension
from tolerances import assert_matches_reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _fused(tokens, heads, kv_heads, head_size, dtype, layout):
    qkv = torch.randn(*tokens, (heads + 2 * kv_heads) * head_size + 5, dtype=dtype)
    q = qkv[..., : heads * head_size]
    k = qkv[..., heads * head_size : (heads + kv_heads) * head_size]
    if layout == "heads":
        q, k = q.unflatten(-1, (heads, head_size)), k.unflatten(-1, (kv_heads, head_size))
    return qkv, q, k


def _check(qkv, q, k, before, positions, head_size, cache, is_neox, offset=0, inverse=False, offsets=None):
    want_q, want_k = rope_reference(positions, before[0], before[1], head_size, cache, is_neox, offset, inverse,
                                    cache_offsets=offsets)
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)
    width = q.shape[-1] * (q.shape[-2] if q.dim() > positions.dim() + 1 else 1)
    width += k.shape[-1] * (k.shape[-2] if k.dim() > positions.dim() + 1 else 1)
    assert torch.equal(qkv[..., width:], before[2][..., width:]), "v or the padding was written"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("tokens, heads, kv_heads", [((333,), 6, 3), ((7, 61), 5, 1), ((1031,), 3, 3)])
def test_threads_split_tokens_mid_way(tokens, heads, kv_heads, is_neox, dtype):
    """Enough (token, head) items for several threads, chunks that start inside a token."""
    head_size, rot_dim = 96, 64
    qkv, q, k = _fused(tokens, heads, kv_heads, head_size, dtype, "heads")
    positions = torch.randint(0, 900, tokens, dtype=torch.int32)
    cache = random_cache(900, rot_dim, torch.bfloat16)
    before = (q.clone(), k.clone(), qkv.clone())
    rope_compat.rotary_embedding(positions, q, k, head_size, cache, is_neox, 16)
    _check(qkv, q, k, before, positions, head_size, cache, is_neox, 16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float64], ids=str)
def test_every_tail_length(cache_dtype, is_neox, dtype):
    """rot_dim 2..98: every partial vector, at an odd offset inside the head."""
    for rot_dim in range(2, 100, 2):
        head_size = rot_dim + 6
        qkv, q, k = _fused((5,), 3, 1, head_size, dtype, "flat")
        positions = torch.randint(0, 50, (5,))
        cache = random_cache(50, rot_dim, cache_dtype)
        before = (q.clone(), k.clone(), qkv.clone())
        inverse = rot_dim % 4 == 0
        rope_compat.rotary_embedding(positions, q, k, head_size, cache, is_neox, 3, inverse)
        _check(qkv, q, k, before, positions, head_size, cache, is_neox, 3, inverse)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16], ids=str)
def test_long_rows_in_segments(cache_dtype, is_neox):
    """rot_dim / 2 beyond the kernel's 1024-pair segment of converted cache row."""
    head_size, rot_dim = 4360, 4326
    qkv, q, k = _fused((3,), 2, 1, head_size, torch.bfloat16, "flat")
    positions = torch.tensor([4, 0, 9])
    cache = random_cache(10, rot_dim, cache_dtype)
    before = (q.clone(), k.clone(), qkv.clone())
    rope_compat.rotary_embedding(positions, q, k, head_size, cache, is_neox, 17, True)
    _check(qkv, q, k, before, positions, head_size, cache, is_neox, 17, True)


@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("bad", [-1, 64], ids=["negative", "past_end"])
def test_bounds_of_a_large_call_before_any_write(bad, pos_dtype):
    """More tokens than the bounds pass runs on one thread; the bad one is the last."""
    n = (1 << 18) + 3
    positions = torch.randint(0, 64, (n,), dtype=pos_dtype)
    positions[-1] = bad
    q, k = torch.randn(n, 2 * 4), torch.randn(n, 4)
    before_q, before_k = q.clone(), k.clone()
    with pytest.raises(IndexError, match=r"positions: cache rows must lie in \[0, 64\), got values in \[-?\d+, \d+\]"):
        rope_compat.rotary_embedding(positions, q, k, 4, random_cache(64, 4, torch.float32), True)
    assert torch.equal(q, before_q) and torch.equal(k, before_k)


def test_batched_offsets_that_wrap_are_rejected():
    """Offsets whose int64 sum with the position wraps negative are out of range, not a read."""
    positions = torch.tensor([1, 2**62, 3])
    offsets = torch.tensor([0, 2**62, 1])
    q, k = torch.randn(3, 64), torch.randn(3, 64)
    before = q.clone()
    with pytest.raises(IndexError, match="positions: cache rows must lie in"):
        rope_compat.batched_rotary_embedding(positions, q, k, 64, random_cache(8, 64, torch.float32), True, 64,
                                             offsets)
    assert torch.equal(q, before)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_batched_offsets_in_threads(dtype):
    tokens, heads, head_size = (4, 150), 8, 64
    qkv, q, k = _fused(tokens, heads, 2, head_size, dtype, "flat")
    positions = torch.randint(0, 100, tokens)
    offsets = torch.randint(0, 3, tokens, dtype=torch.int32) * 100
    cache = random_cache(300, head_size, torch.float32)
    before = (q.clone(), k.clone(), qkv.clone())
    rope_compat.batched_rotary_embedding(positions, q, k, head_size, cache, False, head_size, offsets)
    _check(qkv, q, k, before, positions, head_size, cache, False, offsets=offsets)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_direct_call_and_op_agree_bit_for_bit(dtype):
    """The eager direct path and the dispatcher's kernel are one implementation."""
    positions = torch.randint(0, 500, (77,))
    q, k = torch.randn(77, 6 * 128, dtype=dtype), torch.randn(77, 2 * 128, dtype=dtype)
    cache = random_cache(500, 128, dtype)
    q2, k2 = q.clone(), k.clone()
    rope_compat.rotary_embedding(positions, q, k, 128, cache, True)
    torch.ops.rope_compat.rotary_embedding(positions, q2, k2, 128, cache, True)
    assert torch.equal(q, q2) and torch.equal(k, k2)


def test_op_with_tensors_that_require_grad():
    """Through the dispatcher's autograd key to the CPU kernel: refused in grad mode (the
    in-place ops are not differentiable), rotated in place, unrecorded, under no_grad."""
    positions = torch.randint(0, 64, (9,))
    q = torch.randn(9, 2 * 32, requires_grad=True)
    k = torch.randn(9, 32, requires_grad=True)
    cache = random_cache(64, 32, torch.float32)
    want_q, want_k = rope_reference(positions, q.detach(), k.detach(), 32, cache, True)
    q0 = q.detach().clone()
    with pytest.raises(RuntimeError, match="^query: requires grad, but rope_compat's in-place ops"):
        rope_compat.rotary_embedding(positions, q, k, 32, cache, True)
    assert torch.equal(q.detach(), q0)
    with torch.no_grad():
        rope_compat.rotary_embedding(positions, q, k, 32, cache, True)
    assert_matches_reference(q.detach(), want_q)
    assert_matches_reference(k.detach(), want_k)


@pytest.mark.skipif(not extension.has_cpu_kernel(), reason="the compiled CPU kernel is not loaded")
def test_compiled_module_refuses_other_devices():
    launch = extension.cpu_binding().launch
    meta = dict(device="meta")
    with pytest.raises(ValueError, match="^positions: on device meta; the compiled CPU kernel takes CPU tensors only$"):
        launch(torch.zeros(3, dtype=torch.long, **meta), torch.empty(3, 64, **meta), None, 64,
               torch.empty(10, 64, **meta), True)


@pytest.mark.skipif(not extension.has_cpu_kernel(), reason="the compiled CPU kernel is not loaded")
def test_backend_is_the_cpu_kernel():
    assert rope_compat.backend_for("cpu") == "cpu-kernel"
    assert torch._C._dispatch_has_kernel_for_dispatch_key("rope_compat::rotary_embedding", "CPU")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("rope_compat::batched_rotary_embedding", "CPU")


@pytest.mark.parametrize("buffer_dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float64], ids=str)
def test_set_kv_store_in_threads(buffer_dtype):
    """Enough (token, kv head) items for several threads; strided q/k/v of one fused tensor,
    paged buffers, -1 and past-the-end slots skipped, rows not named left bit-identical."""
    tokens, heads, kv_heads, head_size = 700, 8, 2, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_size, dtype=torch.bfloat16)
    q, k, v = qkv.split([heads * head_size, kv_heads * head_size, kv_heads * head_size], -1)
    positions = torch.randint(0, 512, (tokens,))
    cache = random_cache(512, 32, torch.float32)
    slots = 64 * 16
    loc = torch.randperm(slots)[:tokens]
    loc[::97] = -1
    loc[5] = slots
    k_buf = torch.randn(64, 16, kv_heads, head_size).to(buffer_dtype)
    v_buf = torch.randn(64, 16, kv_heads, head_size).to(buffer_dtype)
    k_before, v_before, q0, k0, v0 = k_buf.clone(), v_buf.clone(), q.clone(), k.clone(), v.clone()
    rope_compat.rotary_embedding_set_kv(positions, q, k, head_size, cache, False, v, k_buf, v_buf, loc,
                                        0.5, 2.0, 8)
    want_q, want_k = rope_reference(positions, q0, k0, head_size, cache, False, 8)
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)
    assert torch.equal(v, v0)
    keep = (loc >= 0) & (loc < slots)
    rows = loc[keep]
    bits = (lambda t: t.view(torch.uint8)) if buffer_dtype == torch.float8_e4m3fn else (lambda t: t)
    want_k_rows = (k[keep].float() / 0.5).to(buffer_dtype).view(-1, kv_heads, head_size)
    want_v_rows = (v[keep].float() / 2.0).to(buffer_dtype).view(-1, kv_heads, head_size)
    got_k, got_v = k_buf.view(slots, kv_heads, head_size), v_buf.view(slots, kv_heads, head_size)
    assert torch.equal(bits(got_k[rows]), bits(want_k_rows))
    assert torch.equal(bits(got_v[rows]), bits(want_v_rows))
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[rows] = False
    assert torch.equal(bits(got_k[untouched]), bits(k_before.view(slots, kv_heads, head_size)[untouched]))
    assert torch.equal(bits(got_v[untouched]), bits(v_before.view(slots, kv_heads, head_size)[untouched]))


def test_set_kv_out_of_range_position_stores_nothing():
    q, k, v = torch.randn(4, 128), torch.randn(4, 64), torch.randn(4, 64)
    k_buf, v_buf = torch.randn(8, 64), torch.randn(8, 64)
    before = [t.clone() for t in (q, k, k_buf, v_buf)]
    with pytest.raises(IndexError, match="positions: cache rows must lie in"):
        rope_compat.rotary_embedding_set_kv(torch.tensor([0, 1, 30, 2]), q, k, 64, random_cache(30, 64, torch.float32),
                                            True, v, k_buf, v_buf, torch.arange(4))
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, k_buf, v_buf)))


@pytest.mark.skipif(not extension.has_cpu_kernel(), reason="the compiled CPU kernel is not loaded")
def test_set_kv_is_the_cpu_kernel():
    assert torch._C._dispatch_has_kernel_for_dispatch_key("rope_compat::rotary_embedding_set_kv", "CPU")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_subnormal_values_are_kept(dtype, is_neox):
    """An identity rotation (cos 1, sin 0) keeps every finite value bit for bit, subnormals of
    the dtype included (which the bf16 conversion instruction would flush to zero); a rotation
    by 90 degrees moves them to the pair's other element."""
    tiny = torch.finfo(dtype).tiny
    values = torch.tensor([tiny / 2, -tiny / 8, tiny / 64, 0.0, 1.5, -3.0, tiny], dtype=dtype)
    q = values[torch.randint(0, values.numel(), (6, 4 * 64))].clone()
    cache = torch.cat([torch.ones(2, 32), torch.zeros(2, 32)], -1)
    cache[1] = torch.cat([torch.zeros(32), torch.ones(32)])  # cos 0, sin 1
    before = q.clone()
    positions = torch.tensor([0, 0, 0, 1, 1, 1])
    rope_compat.rotary_embedding(positions, q, None, 64, cache, is_neox)
    assert torch.equal(q[:3].view(torch.int16 if dtype != torch.float32 else torch.int32),
                       before[:3].view(torch.int16 if dtype != torch.float32 else torch.int32))
    heads = before[3:].unflatten(-1, (4, 64))
    x, y = (heads[..., :32], heads[..., 32:]) if is_neox else (heads[..., 0::2], heads[..., 1::2])
    got = q[3:].unflatten(-1, (4, 64))
    gx, gy = (got[..., :32], got[..., 32:]) if is_neox else (got[..., 0::2], got[..., 1::2])
    # (x, y) -> (x*0 - y*1, y*0 + x*1) = (-y, x), zeros compared by value
    assert torch.equal(gx, -y) and torch.equal(gy, x)
