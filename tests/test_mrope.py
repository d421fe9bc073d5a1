"""mrope_rotary_embedding (multimodal RoPE): against a float64 reference, vLLM's own
MRotaryEmbedding.forward_native, and on CUDA the kernel inside graphs and torch.compile.

Inputs are fresh random values; positions are random over the whole cache and differ per
row (t/h/w), so a pair that read the wrong row would be visible. Outputs of the CUDA kernel
start poisoned: pass-through dims and untouched tokens must come back bit for bit.
"""

import pytest
import torch

import rope_compat
from rope_compat.ops import extension

from cases import _qk, bits, random_cache
from reference import mrope_pair_sections, mrope_reference
from tolerances import assert_matches_reference

op = torch.ops.rope_compat.mrope_rotary_embedding
HAS_KERNEL = extension.has_cuda_kernel()

# (heads, kv_heads, head_size, rot_dim, sections, interleaved)
CONFIGS = {
    "qwen2.5-vl-7b": (28, 4, 128, 128, [16, 24, 24], False),
    "qwen2-vl-small": (12, 2, 128, 128, [16, 24, 24], False),
    "qwen3-vl-8b": (32, 8, 128, 128, [24, 20, 20], True),
    # Boundaries inside a vector: the kernel's per-pair loads on a contiguous layout (all launch
    # paths: enough heads that 9000 tokens take the several-heads-per-thread kernels).
    "contig-unaligned": (32, 8, 128, 128, [13, 27, 24], False),
    "odd-contig": (5, 1, 80, 48, [5, 7, 12], False),
    "odd-interleaved": (3, 3, 64, 40, [9, 6, 5], True),
    "zero-section": (4, 2, 64, 64, [32, 0, 0], False),
    "wide-h-interleaved": (2, 1, 96, 96, [10, 30, 8], True),  # 3*s1 > rot_dim/2
    "mqa-tiny": (2, 1, 8, 8, [1, 2, 1], True),
}


def make_mrope(config, tokens=37, dtype=torch.float32, cache_dtype=torch.float32, layout="flat",
               pos_dtype=torch.int64, cache_rows=2048, device="cpu", with_key=True, padded_positions=False):
    heads, kv_heads, head_size, rot_dim, sections, interleaved = CONFIGS[config]
    if padded_positions:  # a [:, :T] slice of a larger buffer, as engines keep them
        positions = torch.randint(0, cache_rows, (3, tokens + 11), dtype=pos_dtype, device=device)[:, :tokens]
    else:
        positions = torch.randint(0, cache_rows, (3, tokens), dtype=pos_dtype, device=device)
    q, k = _qk((tokens,), heads, kv_heads, head_size, layout, dtype, device)
    cache = random_cache(cache_rows, rot_dim, cache_dtype, device)
    return positions, q, (k if with_key else None), head_size, cache, sections, interleaved


def _check(positions, q, k, head_size, cache, is_neox, sections, interleaved, rope_dim_offset=0, inverse=False,
           fn=None):
    want_q, want_k = mrope_reference(positions, q, k, head_size, cache, is_neox, sections, interleaved,
                                     rope_dim_offset, inverse)
    q0, k0 = q.clone(), None if k is None else k.clone()
    (fn or op)(positions, q, k, head_size, cache, is_neox, sections, interleaved, rope_dim_offset, inverse)
    assert_matches_reference(q, want_q)
    assert not torch.equal(q, q0)
    if k is not None:
        assert_matches_reference(k, want_k)
        assert not torch.equal(k, k0)


def test_reference_sections_match_vllm_rules():
    # Contiguous: [t]*s0 + [h]*s1 + [w]*s2; interleaved: t h w t h w ... then t.
    assert mrope_pair_sections([2, 3, 1], 6, False) == [0, 0, 1, 1, 1, 2]
    assert mrope_pair_sections([3, 2, 2], 7, True) == [0, 1, 2, 0, 1, 2, 0]
    assert mrope_pair_sections([24, 20, 20], 64, True)[57:] == [0, 1, 2, 0, 0, 0, 0]


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference(config, is_neox, dtype, device):
    args = make_mrope(config, dtype=dtype, device=device)
    _check(*args[:5], is_neox, *args[5:])


@pytest.mark.parametrize("layout", ["heads", "fused_flat", "fused_heads"])
@pytest.mark.parametrize("cache_dtype", [torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_layouts_cache_and_position_dtypes(layout, cache_dtype, pos_dtype, device):
    args = make_mrope("qwen3-vl-8b", tokens=9, dtype=torch.bfloat16, cache_dtype=cache_dtype, layout=layout,
                      pos_dtype=pos_dtype, device=device, padded_positions=True)
    _check(*args[:5], True, *args[5:])


@pytest.mark.parametrize("config", ["odd-contig", "qwen2.5-vl-7b"])
def test_partial_offset_inverse_and_no_key(config, device):
    heads, kv, head_size, rot, sections, inter = CONFIGS[config]
    positions, q, _, _, cache, _, _ = make_mrope(config, tokens=13, device=device, with_key=False)
    offset = 0 if rot == head_size else 16
    _check(positions, q, None, head_size, cache, False, sections, inter, rope_dim_offset=offset)
    positions, q, k, _, cache, _, _ = make_mrope(config, tokens=5, dtype=torch.float16, device=device)
    _check(positions, q, k, head_size, cache, True, sections, inter, inverse=True)
    # inverse undoes the rotation
    q0 = q.clone()
    op(positions, q, k, head_size, cache, True, sections, inter)
    op(positions, q, k, head_size, cache, True, sections, inter, 0, True)
    torch.testing.assert_close(q, q0, rtol=4e-3, atol=4e-3)


def test_equal_positions_are_plain_rope(device):
    """Text tokens (t = h = w) rotate exactly as the plain op with that position."""
    positions, q, k, head_size, cache, sections, inter = make_mrope("qwen3-vl-8b", tokens=21, device=device,
                                                                     dtype=torch.bfloat16)
    positions = positions[:1].expand(3, -1).contiguous()
    q2, k2 = q.clone(), k.clone()
    op(positions, q, k, head_size, cache, True, sections, inter)
    rope_compat.rotary_embedding(positions[0], q2, k2, head_size, cache, True)
    assert torch.equal(q, q2) and torch.equal(k, k2)


def test_public_function_and_empty(device):
    args = make_mrope("odd-interleaved", tokens=3, device=device)
    _check(*args[:5], True, *args[5:], fn=lambda *a: rope_compat.mrope_rotary_embedding(*a))
    positions, q, k, head_size, cache, sections, inter = make_mrope("odd-contig", tokens=0, device=device)
    op(positions, q, k, head_size, cache, True, sections, inter)  # no tokens: nothing to do


def test_cpu_position_out_of_range_raises_before_writing():
    positions, q, k, head_size, cache, sections, inter = make_mrope("odd-contig", tokens=6)
    positions[2, 3] = cache.shape[0]
    q0 = q.clone()
    with pytest.raises(IndexError, match=r"positions: cache rows must lie in \[0, 2048\)"):
        op(positions, q, k, head_size, cache, True, sections, inter)
    assert torch.equal(q, q0)


# ---------------------------------------------------------------- errors


def _bad_calls(device="cpu"):
    P = lambda *s, d=torch.int64: torch.zeros(*s, dtype=d, device=device)  # noqa: E731
    q, k = torch.randn(4, 2 * 64, device=device), torch.randn(4, 64, device=device)
    cache = random_cache(16, 32, torch.float32, device)
    S = [4, 6, 6]
    yield "float-positions", (P(3, 4, d=torch.float32), q, k, 64, cache, True, S), TypeError, "positions: expected dtype"
    yield "1d-positions", (P(4), q, k, 64, cache, True, S), ValueError, r"positions: expected shape \[3, num_tokens\]"
    yield "2-rows", (P(2, 4), q, k, 64, cache, True, S), ValueError, r"got \(2, 4\)"
    yield "strided-rows", (P(3, 8)[:, ::2], q, k, 64, cache, True, S), ValueError, "each row must be contiguous"
    yield "tokens-mismatch", (P(3, 5), q, k, 64, cache, True, S), ValueError, "query: leading dims"
    yield "sections-sum", (P(3, 4), q, k, 64, cache, True, [4, 6, 5]), ValueError, \
        r"mrope_section: expected 3 non-negative sections summing to rot_dim / 2 = 16, got \[4, 6, 5\]"
    yield "sections-count", (P(3, 4), q, k, 64, cache, True, [8, 8]), ValueError, r"got \[8, 8\]"
    yield "sections-negative", (P(3, 4), q, k, 64, cache, True, [18, -2, 0]), ValueError, r"got \[18, -2, 0\]"
    yield "gqa", (P(3, 4), q, torch.randn(4, 3 * 64, device=device), 64, cache, True, S), ValueError, "must be a multiple of key"
    yield "q-dtype", (P(3, 4), q.double(), k, 64, cache, True, S), TypeError, "query: expected dtype"
    yield "rot-too-big", (P(3, 4), q, k, 16, random_cache(16, 32, torch.float32, device), True, S), ValueError, \
        "exceeds head_size"


BAD = list(_bad_calls())


@pytest.mark.parametrize("name,args,exc,match", BAD, ids=[b[0] for b in BAD])
def test_errors_name_the_argument(name, args, exc, match):
    with pytest.raises(exc, match=match):
        op(*args)
    with pytest.raises(exc, match=match):  # the fake impl (torch.compile) checks the same
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode() as mode:
            fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            op(*fake)


MROPE_TYPE_BAD = [
    (0, None, "positions: expected a torch.Tensor, got NoneType"),
    (2, 3, "key: expected a torch.Tensor or None, got int"),
    (3, 64.0, "head_size: expected an int (64-bit), got float"),
    (5, None, "is_neox: expected a bool, got NoneType"),
    (6, 16, "mrope_section: expected a list of ints, got int"),
    (6, [4, 6.0, 6], "mrope_section: expected an int (64-bit), got float"),
    (7, "yes", "mrope_interleaved: expected a bool, got str"),
    (8, 1.5, "rope_dim_offset: expected an int (64-bit), got float"),
    (9, None, "inverse: expected a bool, got NoneType"),
]


def _type_bad_entries(device):
    entries = {"function": rope_compat.mrope_rotary_embedding, "torch_impl": rope_compat.ops.mrope.mrope_rotary_embedding}
    if device == "cuda" and HAS_KERNEL:
        entries["launch"] = extension.direct_binding().mrope_launch
    return entries


@pytest.mark.parametrize("index, bad, message", MROPE_TYPE_BAD, ids=[m.split(":")[0] + str(i) for i, (_, _, m)
                                                                        in enumerate(MROPE_TYPE_BAD)])
def test_wrong_types_named_before_anything_runs(index, bad, message, device):
    """The public function checks types itself (the dispatcher would convert some by schema):
    the same TypeError from it, the Torch implementation and the compiled entry, nothing written."""
    positions, q, k, head_size, cache, sections, inter = make_mrope("odd-contig", tokens=5, device=device)
    args = [positions, q, k, head_size, cache, True, sections, inter, 0, False]
    args[index] = bad
    before = (q.clone(), k.clone())
    for entry, fn in _type_bad_entries(device).items():
        with pytest.raises(TypeError) as info:
            fn(*args)
        assert str(info.value) == message, entry
        assert torch.equal(q, before[0]) and torch.equal(k, before[1]), entry


# ---------------------------------------------------------------- torch.compile, modules


def test_compile_fullgraph_cpu():
    torch._dynamo.reset()
    positions, q, k, head_size, cache, sections, inter = make_mrope("qwen3-vl-8b", tokens=7, dtype=torch.bfloat16)

    def f(positions, qkv):
        q, k = qkv[:, : 32 * 128], qkv[:, 32 * 128 : 40 * 128]
        rope_compat.mrope_rotary_embedding(positions, q, k, head_size, cache, True, sections, inter)
        return qkv * 2

    qkv = torch.randn(7, 48 * 128, dtype=torch.bfloat16)
    want = f(positions, qkv.clone())
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(positions, qkv.clone())
    assert torch.equal(got, want)
    torch._dynamo.reset()


@pytest.mark.parametrize("config", ["qwen2.5-vl-7b", "qwen3-vl-8b"])
def test_get_rope_mrope_module(config, device):
    heads, kv, head_size, rot, sections, inter = CONFIGS[config]
    rope = rope_compat.get_rope(head_size, 1024, True, {"rope_theta": 1e6, "mrope_section": sections,
                                                         "mrope_interleaved": inter}, torch.bfloat16)
    assert isinstance(rope, rope_compat.MRotaryEmbedding)
    cache = rope.cos_sin_cache.to(device)
    positions = torch.randint(0, cache.shape[0], (3, 11), device=device)
    q, k = _qk((11,), heads, kv, head_size, "fused_flat", torch.bfloat16, device)
    want_q, want_k = mrope_reference(positions, q, k, head_size, cache, True, sections, inter)
    rope(positions, q, k)
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)
    # text-only: 1-D positions rotate as plain RoPE
    p1 = torch.randint(0, 1024, (11,), device=device)
    q1 = torch.randn(11, heads * head_size, dtype=torch.bfloat16, device=device)
    want = mrope_reference(p1.expand(3, -1), q1, None, head_size, cache, True, sections, inter)[0]
    rope(p1, q1)
    assert_matches_reference(q1, want)


# ---------------------------------------------------------------- vLLM's own layer


def _vllm_mrope_cls():
    try:
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding
    except Exception:
        return None
    return MRotaryEmbedding, VllmConfig, set_current_vllm_config


VLLM = _vllm_mrope_cls()


@pytest.mark.vllm
@pytest.mark.skipif(VLLM is None, reason="vLLM's Python layer does not import here")
@pytest.mark.parametrize("config", ["qwen2.5-vl-7b", "qwen3-vl-8b", "odd-contig", "odd-interleaved",
                                    "wide-h-interleaved"])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_vllm_forward_native(config, is_neox, dtype):
    cls, VllmConfig, set_config = VLLM
    heads, kv, head_size, rot, sections, inter = CONFIGS[config]
    with set_config(VllmConfig()):
        theirs = cls(head_size, rot, 512, 1e6, is_neox, dtype, sections, inter)
        ours = rope_compat.MRotaryEmbedding(head_size, rot, 512, 1e6, is_neox, dtype, {"rope_theta": 1e6},
                                            mrope_section=sections, mrope_interleaved=inter, cache_dtype=dtype)
        positions = torch.randint(0, 512 * 4, (3, 29))
        q, k = _qk((29,), heads, kv, head_size, "flat", dtype, "cpu")
        want_q, want_k = theirs.forward_native(positions, q.clone(), k.clone())
        got_q, got_k = ours(positions, q.clone(), k.clone())
        # vLLM's cache comes from a float32 angle p * f (error up to p * 2**-24, about 1e-4 rad
        # at p = 2048), ours from a float64 angle rounded once; in bf16 vLLM's forward_native
        # also rounds each product to bf16. So, per element, a bound in units of the rotated
        # pair's magnitude m: float32 1e-3 * m (the angle error); bf16 8 * 2**-8 * m with the
        # two caches (two roundings of cos/sin, three of vLLM's arithmetic, one of ours), and
        # 4 * 2**-8 * m with vLLM's own cache, where only the arithmetic differs.
        loose, tight = (1e-3, 2e-6) if dtype == torch.float32 else (8 * 2**-8, 4 * 2**-8)
        _assert_pairwise_close(got_q, want_q, q, head_size, rot, is_neox, loose)
        _assert_pairwise_close(got_k, want_k, k, head_size, rot, is_neox, loose)
        cache = theirs.cos_sin_cache.to(dtype)
        q2, k2 = q.clone(), k.clone()
        op(positions, q2, k2, head_size, cache, is_neox, sections, inter)
        _assert_pairwise_close(q2, want_q, q, head_size, rot, is_neox, tight)
        _assert_pairwise_close(k2, want_k, k, head_size, rot, is_neox, tight)


def _assert_pairwise_close(got, want, original, head_size, rot, is_neox, per_magnitude):
    """Pass-through dims equal; rotated dims within `per_magnitude` * the pair's magnitude."""
    g = got.double().unflatten(-1, (-1, head_size))
    w = want.double().unflatten(-1, (-1, head_size))
    assert torch.equal(g[..., rot:], w[..., rot:])
    x = original.double().unflatten(-1, (-1, head_size))[..., :rot]
    half = rot // 2
    if is_neox:
        a, b = x[..., :half], x[..., half:]
        m = (a * a + b * b).sqrt()
        m = torch.cat([m, m], -1)
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        m = (a * a + b * b).sqrt().repeat_interleave(2, -1)
    worst = float(((g[..., :rot] - w[..., :rot]).abs() / (per_magnitude * m + 1e-30)).max())
    assert worst <= 1.0, f"differs by {worst:.2f} x the allowed {per_magnitude} of the pair magnitude"


# ---------------------------------------------------------------- CUDA

gpu = pytest.mark.gpu
needs_kernel = pytest.mark.skipif(not HAS_KERNEL, reason="the CUDA kernel is not built")


@gpu
@needs_kernel
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 3, 64, 3000, 9000])
def test_cuda_kernel_poisoned_outputs(config, is_neox, dtype, tokens):
    """Every launch path (one head per thread; from 9000 tokens of the 128-dim configs, several
    heads per thread and GPT-J over both halves; 8- and 16-byte vectors); pass-through dims
    untouched."""
    positions, q, k, head_size, cache, sections, inter = make_mrope(
        config, tokens=tokens, dtype=dtype, layout="fused_heads", device="cuda", padded_positions=True)
    rot = cache.shape[1]
    offset = (head_size - rot) // 2 // 8 * 8
    q0, k0 = q.clone(), k.clone()
    want_q, want_k = mrope_reference(positions, q, k, head_size, cache, is_neox, sections, inter, offset)
    op(positions, q, k, head_size, cache, is_neox, sections, inter, offset)
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)
    keep = torch.ones(head_size, dtype=torch.bool)
    keep[offset : offset + rot] = False
    assert torch.equal(q[..., keep], q0[..., keep]) and torch.equal(k[..., keep], k0[..., keep])


@gpu
@needs_kernel
@pytest.mark.parametrize("cache_dtype", [torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("with_key", [True, False])
def test_cuda_cache_position_dtypes_no_key(cache_dtype, pos_dtype, with_key):
    args = make_mrope("qwen2.5-vl-7b", tokens=200, dtype=torch.bfloat16, cache_dtype=cache_dtype,
                      pos_dtype=pos_dtype, device="cuda", with_key=with_key, layout="fused_flat")
    _check(*args[:5], True, *args[5:])
    args = make_mrope("qwen3-vl-8b", tokens=5, dtype=torch.float16, cache_dtype=cache_dtype,
                      pos_dtype=pos_dtype, device="cuda", with_key=with_key)
    _check(*args[:5], False, *args[5:], inverse=True)


@gpu
@needs_kernel
def test_cuda_out_of_range_token_untouched():
    positions, q, k, head_size, cache, sections, inter = make_mrope("qwen3-vl-8b", tokens=40, device="cuda",
                                                                     dtype=torch.bfloat16)
    positions[1, 7] = cache.shape[0]
    positions[2, 9] = -1
    q0 = q.clone()
    op(positions, q, k, head_size, cache, True, sections, inter)
    assert torch.equal(q[7], q0[7]) and torch.equal(q[9], q0[9])
    # the Torch implementation on CUDA tensors does the same
    q1, k1 = q0.clone(), None
    rope_compat.ops.mrope.mrope_rotary_embedding(positions, q1, k1, head_size, cache, True, sections, inter)
    assert_matches_reference(q1, q)


@gpu
@needs_kernel
@pytest.mark.parametrize("config", ["qwen3-vl-8b", "qwen2.5-vl-7b"])
@pytest.mark.parametrize("tokens", [40, 1024, 1100, 9000])
def test_cuda_out_of_range_tokens_keep_their_bits(config, tokens):
    """A token with a position outside the cache comes back bit for bit, inf and NaN included,
    on every launch path (one wave, where the one-head kernels load q/k before the positions;
    one head per thread beyond it, as Qwen2.5-VL at 1100 tokens and Qwen3-VL from 1024 on a
    132-SM GPU; several heads per thread), and the other tokens rotate."""
    positions, q, k, head_size, cache, sections, inter = make_mrope(
        config, tokens=tokens, dtype=torch.bfloat16, layout="fused_heads", device="cuda")
    bad = [3, tokens - 2]
    valid = positions.clone()
    positions[1, bad[0]] = cache.shape[0]
    positions[2, bad[1]] = -1
    specials = torch.tensor([float("inf"), float("-inf"), float("nan")], dtype=q.dtype, device="cuda")
    for t in bad:
        q[t, 0, :3] = specials
        k[t, -1, -3:] = specials
    want_q, want_k = mrope_reference(valid, q, k, head_size, cache, True, sections, inter)
    q0, k0 = q.clone(), k.clone()
    op(positions, q, k, head_size, cache, True, sections, inter)
    assert torch.equal(bits(q[bad]), bits(q0[bad])) and torch.equal(bits(k[bad]), bits(k0[bad]))
    good = [t for t in range(tokens) if t not in bad]
    assert_matches_reference(q[good], want_q[good])
    assert_matches_reference(k[good], want_k[good])


@gpu
@needs_kernel
@pytest.mark.parametrize("name,args,exc,match", BAD, ids=[b[0] for b in BAD])
def test_cuda_errors_same_as_cpu(name, args, exc, match):
    cuda_args = {b[0]: b[1] for b in _bad_calls("cuda")}[name]
    assert all(a.is_cuda for a in cuda_args if isinstance(a, torch.Tensor))
    cpu_msg = None
    try:
        op(*args)
    except exc as e:
        cpu_msg = str(e)
    assert cpu_msg is not None
    for fn in (op, rope_compat.mrope_rotary_embedding):  # the dispatcher, and the direct path
        with pytest.raises(exc) as info:
            fn(*cuda_args)
        assert str(info.value) == cpu_msg


@gpu
@needs_kernel
def test_cuda_graph_no_sync_no_allocation():
    cases = [make_mrope(c, tokens=t, dtype=torch.bfloat16, device="cuda", layout="fused_flat")
             for c, t in (("qwen2.5-vl-7b", 1), ("qwen3-vl-8b", 17), ("odd-interleaved", 300))]
    for c in cases:  # warm-up
        op(*c[:5], True, *c[5:])
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for c in cases:
            op(*c[:5], True, *c[5:])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocated
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in cases:
            op(*c[:5], True, *c[5:])
    for _ in range(5):
        wants = []
        for positions, q, k, head_size, cache, sections, inter in cases:
            positions.random_(0, cache.shape[0])
            q.normal_()
            k.normal_()
            wants.append(mrope_reference(positions, q, k, head_size, cache, True, sections, inter))
        graph.replay()
        torch.cuda.synchronize()
        for c, (wq, wk) in zip(cases, wants):
            assert_matches_reference(c[1], wq)
            assert_matches_reference(c[2], wk)


@gpu
@needs_kernel
def test_cuda_compile_fullgraph():
    torch._dynamo.reset()
    positions, q, k, head_size, cache, sections, inter = make_mrope("qwen2.5-vl-7b", tokens=33, device="cuda",
                                                                     dtype=torch.bfloat16)
    rope = rope_compat.get_rope(head_size, 4096, True, {"rope_theta": 1e6, "mrope_section": sections},
                                torch.bfloat16).cuda()

    def f(positions, qkv):
        q, k = qkv[:, : 28 * 128], qkv[:, 28 * 128 : 32 * 128]
        rope(positions, q, k)
        return qkv + 1

    qkv = torch.randn(33, 36 * 128, dtype=torch.bfloat16, device="cuda")
    want = f(positions, qkv.clone())
    got = torch.compile(f, fullgraph=True)(positions, qkv.clone())
    assert torch.equal(got, want)
    torch._dynamo.reset()
