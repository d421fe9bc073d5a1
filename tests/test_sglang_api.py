"""rope_compat.sglang (SGLang's rope entry points), FusedSetKVBufferArg's two forms,
patch_sglang() on stand-in SGLang modules, and the sgl_kernel alias. No SGLang needed
(test_sglang_layers.py runs the real one)."""

import inspect
import sys
import types

import pytest
import torch

import rope_compat
from rope_compat import FusedSetKVBufferArg
from rope_compat import sglang as sgl
from rope_compat.compat import sgl_kernel_alias
from rope_compat.compat._bindings import runs_code_of

from cases import random_cache
from reference import rope_reference
from tolerances import assert_matches_reference

# SGLang 0.5.23's signatures (sglang/kernels/ops/attention/rope.py), parameter by parameter.
SGLANG_SIGNATURES = {
    "apply_rope_with_cos_sin_cache_inplace":
        "(q, k, cos_sin_cache, positions, *, is_neox, rope_dim=0, fused_args=None)",
    "apply_rope_inplace": "(q, k, cos_sin_cache, positions, *, is_neox, rope_dim=0)",
    "apply_rope_inplace_with_kvcache":
        "(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, *, is_neox, rope_dim=0)",
    "rotary_embedding": "(positions, query, key, head_size, cos_sin_cache, is_neox=True)",
}


def _plain(fn) -> str:
    sig = inspect.signature(fn)
    return str(sig.replace(
        parameters=[p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()],
        return_annotation=inspect.Signature.empty,
    ))


@pytest.mark.parametrize("name", sorted(SGLANG_SIGNATURES))
def test_signatures_are_sglangs(name):
    assert _plain(getattr(sgl, name)) == SGLANG_SIGNATURES[name]


def _views(device, dtype, heads, kv_heads, head, tokens=13):
    """q/k as SGLang's forward_cuda passes them: [T, H, head] views of a fused qkv tensor."""
    width = (heads + 2 * kv_heads) * head
    qkv = torch.randn(tokens, width + 8, dtype=dtype, device=device)
    q = qkv[:, : heads * head].view(tokens, heads, head)
    k = qkv[:, heads * head: (heads + kv_heads) * head].view(tokens, kv_heads, head)
    return qkv, q, k


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot", [64, 32])
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("rope_dim_arg", [False, True])
def test_apply_rope_matches_reference(device, dtype, is_neox, rot, pos_dtype, rope_dim_arg):
    head, tokens = 64, 13
    qkv, q, k = _views(device, dtype, 8, 2, head, tokens)
    before = qkv.clone()
    cache = random_cache(1000, rot, torch.float32, device)
    positions = torch.randint(0, 1000, (tokens,), dtype=pos_dtype, device=device)
    want_q, want_k = rope_reference(positions, q, k, head, cache, is_neox)
    # SGLang slices the views to the rotary dims for partial rotation.
    sgl.apply_rope_with_cos_sin_cache_inplace(
        q=q[..., :rot], k=k[..., :rot], cos_sin_cache=cache, positions=positions, is_neox=is_neox,
        **({"rope_dim": rot} if rope_dim_arg else {}),
    )
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)
    assert torch.equal(qkv[:, 10 * head:], before[:, 10 * head:])  # v and padding untouched


def test_apply_rope_inplace_and_rotary_embedding(device):
    _, q, k = _views(device, torch.bfloat16, 4, 4, 128)
    cache = random_cache(64, 128, torch.float32, device)
    positions = torch.randint(0, 64, (q.shape[0],), device=device)
    want_q, want_k = rope_reference(positions, q, k, 128, cache, False)
    q2, k2 = q.clone(), k.clone()
    sgl.apply_rope_inplace(q, k, cache, positions, is_neox=False)
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)
    q3, k3 = q2.clone(), k2.clone()
    sgl.apply_rope_inplace(q3.flatten(1), k3.flatten(1), cache, positions, is_neox=False)  # [T, H * D] too
    assert_matches_reference(q3, want_q)
    assert_matches_reference(k3, want_k)
    out = sgl.rotary_embedding(positions, q2.flatten(1), k2.flatten(1), 128, cache, False)
    assert out[0].data_ptr() == q2.data_ptr() and out[1].data_ptr() == k2.data_ptr()
    assert_matches_reference(q2, want_q)
    assert_matches_reference(k2, want_k)


def _buffers(device, dtype, kv_heads, head, tokens, rows):
    return (torch.randn(tokens, kv_heads * head, dtype=dtype, device=device),
            torch.randn(rows, kv_heads * head, dtype=dtype, device=device),  # poison
            torch.randn(rows, kv_heads * head, dtype=dtype, device=device),
            torch.randperm(rows, device=device)[:tokens])


class SglangArg:
    """SGLang 0.5.x's 4-field FusedSetKVBufferArg, as an unrelated class."""

    def __init__(self, value, k_buffer, v_buffer, cache_loc):
        self.value, self.k_buffer, self.v_buffer, self.cache_loc = value, k_buffer, v_buffer, cache_loc


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", ["sglang-object", "ours-4", "ours-6", "with_kvcache"])
@pytest.mark.parametrize("loc_dtype", [torch.int64, torch.int32])
def test_fused_store_matches_reference(device, dtype, form, loc_dtype):
    head, kv_heads, tokens, rows = 64, 2, 11, 40
    _, q, k = _views(device, dtype, 4, kv_heads, head, tokens)
    cache = random_cache(500, head, torch.float32, device)
    positions = torch.randint(0, 500, (tokens,), device=device)
    value, kb, vb, loc = _buffers(device, dtype, kv_heads, head, tokens, rows)
    loc = loc.to(loc_dtype)
    kb0, vb0 = kb.clone(), vb.clone()
    want_q, want_k = rope_reference(positions, q, k, head, cache, True)
    if form == "with_kvcache":
        sgl.apply_rope_inplace_with_kvcache(q, k, value.view(tokens, kv_heads, head), kb, vb, cache,
                                            positions, loc, is_neox=True)
    else:
        arg = {"sglang-object": lambda: SglangArg(value, kb, vb, loc),
               "ours-4": lambda: FusedSetKVBufferArg(value, kb, vb, loc),
               "ours-6": lambda: FusedSetKVBufferArg(value, kb, vb, None, None, loc)}[form]()
        sgl.apply_rope_with_cos_sin_cache_inplace(q, k, cache, positions, is_neox=True, fused_args=arg)
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)
    rows_written = loc.long().cpu()
    others = torch.ones(rows, dtype=torch.bool)
    others[rows_written] = False
    assert_matches_reference(kb.cpu()[rows_written], want_k.reshape(tokens, -1))
    assert torch.equal(vb.cpu()[rows_written], value.cpu())
    assert torch.equal(kb.cpu()[others], kb0.cpu()[others]) and torch.equal(vb.cpu()[others], vb0.cpu()[others])


def _dispatched_ops(fn) -> list:
    """Names of the rope_compat ops the dispatcher saw during fn() (the profiler records each)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("rope_compat::")]


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and rope_compat.has_cuda_kernel()),
                    reason="needs a CUDA device and the CUDA kernel")
def test_fused_decode_call_skips_the_dispatcher():
    """SGLang's fused call takes the direct launch, as rotary_embedding_set_kv does (through the
    dispatcher it cost several microseconds of host time per call)."""
    head, kv_heads, tokens, rows = 64, 2, 3, 16
    _, q, k = _views("cuda", torch.bfloat16, 4, kv_heads, head, tokens)
    cache = random_cache(100, head, torch.float32, "cuda")
    positions = torch.randint(0, 100, (tokens,), device="cuda")
    value, kb, vb, loc = _buffers("cuda", torch.bfloat16, kv_heads, head, tokens, rows)
    arg = FusedSetKVBufferArg(value, kb, vb, loc)
    call = lambda: sgl.apply_rope_with_cos_sin_cache_inplace(q, k, cache, positions, is_neox=True,  # noqa: E731
                                                             fused_args=arg)
    assert _dispatched_ops(call) == []
    # The check can see the dispatcher: the op itself is recorded.
    op = torch.ops.rope_compat.rotary_embedding_set_kv
    seen = _dispatched_ops(lambda: op(positions, q, k, head, cache, True, value, kb, vb, loc))
    assert "rope_compat::rotary_embedding_set_kv" in seen


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda q, k, c, p: sgl.apply_rope_with_cos_sin_cache_inplace(q, k, c[:, :32], p, is_neox=True),
         ValueError, r"query: last dim is 64, expected head_size=32"),
        (lambda q, k, c, p: sgl.apply_rope_with_cos_sin_cache_inplace(q, k, c, p, is_neox=True, rope_dim=32),
         ValueError, r"rope_dim: 32 must equal cos_sin_cache.size\(-1\) = 64"),
        (lambda q, k, c, p: sgl.apply_rope_inplace(q, k[..., :32], c, p, is_neox=True, rope_dim=64),
         ValueError, r"key: last dim is 32, expected head_size=64"),
        (lambda q, k, c, p: sgl.apply_rope_with_cos_sin_cache_inplace(q, k.half(), c, p, is_neox=True),
         TypeError, r"key: dtype"),
    ],
    ids=["wider-head", "rope-dim", "narrow-k", "dtype"],
)
def test_bad_calls_raise_before_writing(call, exc, match):
    _, q, k = _views("cpu", torch.float32, 4, 2, 64)
    cache = random_cache(100, 64, torch.float32)
    positions = torch.randint(0, 100, (q.shape[0],))
    q0, k0 = q.clone(), k.clone()
    with pytest.raises(exc, match=match):
        call(q, k, cache, positions)
    assert torch.equal(q, q0) and torch.equal(k, k0)


def test_fused_store_refuses_partial_views():
    """SGLang's kernel stores only whole heads; a rotary-dims view with full-width buffers is
    refused by name (SGLang's kernel refuses it too)."""
    _, q, k = _views("cpu", torch.float32, 4, 2, 64)
    value, kb, vb, loc = _buffers("cpu", torch.float32, 2, 64, q.shape[0], 30)
    cache = random_cache(100, 32, torch.float32)
    positions = torch.randint(0, 100, (q.shape[0],))
    kb0 = kb.clone()
    with pytest.raises(ValueError, match="value|k_buffer"):
        sgl.apply_rope_with_cos_sin_cache_inplace(
            q[..., :32], k[..., :32], cache, positions, is_neox=True,
            fused_args=FusedSetKVBufferArg(value, kb, vb, loc))
    assert torch.equal(kb, kb0)


def test_fused_arg_forms():
    t = [torch.zeros(1) for _ in range(4)]
    four = FusedSetKVBufferArg(*t)
    assert four.cache_loc is t[3] and four.k_scale is None and four.v_scale is None
    six = FusedSetKVBufferArg(t[0], t[1], t[2], 0.5, 2.0, t[3])
    assert (six.k_scale, six.v_scale, six.cache_loc) == (0.5, 2.0, t[3])
    five_kw = FusedSetKVBufferArg(t[0], t[1], t[2], 0.5, None, cache_loc=t[3])
    assert five_kw.k_scale == 0.5 and five_kw.cache_loc is t[3]
    kw = FusedSetKVBufferArg(value=t[0], k_buffer=t[1], v_buffer=t[2], cache_loc=t[3], v_scale=3.0)
    assert kw.v_scale == 3.0 and kw.k_scale is None
    assert four == FusedSetKVBufferArg(t[0], t[1], t[2], k_scale=None, v_scale=None, cache_loc=t[3])
    with pytest.raises(TypeError, match="missing required argument 'cache_loc'"):
        FusedSetKVBufferArg(t[0], t[1], t[2])
    with pytest.raises(TypeError, match="multiple values for argument 'cache_loc'"):
        FusedSetKVBufferArg(*t, cache_loc=t[3])
    with pytest.raises(TypeError, match="7 positional"):
        FusedSetKVBufferArg(*t, 1, 2, 3)


# ---- patch_sglang on stand-in SGLang modules ---------------------------------------------

ROPE_MODULE = "sglang.kernels.ops.attention.rope"


def _sglang_like(name):
    """A function with SGLang's signature for `name` that must never run once patched."""
    src = f"def {name}{SGLANG_SIGNATURES[name]}:\n    raise AssertionError('SGLang kernel ran')\n"
    ns = {}
    exec(src, ns)  # noqa: S102 - builds the stand-in's signature from the table above
    return ns[name]


@pytest.fixture
def fake_sglang(monkeypatch):
    """sglang.kernels.ops.attention.rope with SGLang's four functions, and a layer module that
    from-imported one of them; any real SGLang is hidden for the test."""
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    parts = ROPE_MODULE.split(".")
    for i in range(1, len(parts) + 1):
        mod = types.ModuleType(".".join(parts[:i]))
        mod.__path__ = []
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    rope = sys.modules[ROPE_MODULE]
    for name in SGLANG_SIGNATURES:
        setattr(rope, name, _sglang_like(name))
    layer = types.ModuleType("sglang.srt_layer_stand_in")
    layer.apply_rope_with_cos_sin_cache_inplace = rope.apply_rope_with_cos_sin_cache_inplace
    monkeypatch.setitem(sys.modules, layer.__name__, layer)
    yield rope, layer
    rope_compat.unpatch_sglang()


def test_patch_rebinds_module_and_from_imports_and_unpatches_exactly(fake_sglang):
    rope, layer = fake_sglang
    originals = {n: getattr(rope, n) for n in SGLANG_SIGNATURES}
    status = rope_compat.patch_sglang()
    key = f"{ROPE_MODULE}.apply_rope_with_cos_sin_cache_inplace"
    assert sorted(status.sglang[key]) == sorted([key, "sglang.srt_layer_stand_in.apply_rope_with_cos_sin_cache_inplace"])
    assert status.patched
    for n in SGLANG_SIGNATURES:
        assert runs_code_of(getattr(rope, n), getattr(sgl, n))
    # The patched name in the layer module runs rope-compat's code.
    _, q, k = _views("cpu", torch.float32, 4, 2, 64)
    cache = random_cache(50, 64, torch.float32)
    positions = torch.randint(0, 50, (q.shape[0],))
    want_q, _ = rope_reference(positions, q, k, 64, cache, True)
    layer.apply_rope_with_cos_sin_cache_inplace(positions=positions, q=q, k=k, cos_sin_cache=cache,
                                                is_neox=True, fused_args=None)
    assert_matches_reference(q, want_q)
    later = types.ModuleType("sglang.imported_later")
    later.fn = rope.apply_rope_inplace  # from-imported after the patch
    sys.modules[later.__name__] = later
    try:
        assert rope_compat.patch_sglang().sglang == rope_compat.patch_status().sglang  # idempotent
        rope_compat.unpatch_sglang()
        for n in SGLANG_SIGNATURES:
            assert getattr(rope, n) is originals[n]
        assert layer.apply_rope_with_cos_sin_cache_inplace is originals["apply_rope_with_cos_sin_cache_inplace"]
        assert later.fn is originals["apply_rope_inplace"]
        assert rope_compat.patch_status().sglang == {}
    finally:
        del sys.modules[later.__name__]


def test_sglang_patched_context(fake_sglang):
    rope, _ = fake_sglang
    original = rope.rotary_embedding
    with rope_compat.sglang_patched() as status:
        assert status.sglang and rope.rotary_embedding is not original
    assert rope.rotary_embedding is original


def test_signature_mismatch_refuses_and_changes_nothing(fake_sglang):
    rope, layer = fake_sglang
    ns = {}
    exec("def apply_rope_inplace(q, k, cos_sin_cache, positions, *, is_neox, rope_dim=0, extra=1): pass", ns)
    rope.apply_rope_inplace = ns["apply_rope_inplace"]
    before = dict(vars(rope))
    with pytest.raises(rope_compat.UnsupportedSglangError, match=r"apply_rope_inplace has the signature .*extra=1.*not patching"):
        rope_compat.patch_sglang()
    assert dict(vars(rope)) == before and rope_compat.patch_status().sglang == {}


def test_sgl_kernel_style_signature_gets_the_sgl_kernel_function(fake_sglang):
    rope, _ = fake_sglang
    ns = {}
    exec("def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, "
         "is_neox=True, fused_set_kv_buffer_arg=None, enable_pdl=None): pass", ns)
    rope.apply_rope_with_cos_sin_cache_inplace = ns["apply_rope_with_cos_sin_cache_inplace"]
    rope_compat.patch_sglang()
    assert runs_code_of(rope.apply_rope_with_cos_sin_cache_inplace, rope_compat.apply_rope_with_cos_sin_cache_inplace)


def test_without_sglang_patch_refuses(monkeypatch):
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "sglang", None)  # import sglang fails as if absent
    with pytest.raises(rope_compat.UnsupportedSglangError, match="SGLang is not installed"):
        rope_compat.patch_sglang()


# ---- the sgl_kernel alias ------------------------------------------------------------------

@pytest.fixture
def sgl_kernel_absent(monkeypatch):
    if "sgl_kernel" in sys.modules and not sgl_kernel_alias.alias_installed():
        pytest.skip("a real sgl-kernel is imported")
    monkeypatch.setattr(sgl_kernel_alias, "_real_sgl_kernel_found", lambda: False)
    yield
    rope_compat.uninstall_sgl_kernel_alias()


def test_sgl_kernel_alias_gives_the_rope_names(sgl_kernel_absent):
    assert rope_compat.install_sgl_kernel_alias() and rope_compat.install_sgl_kernel_alias()
    import sgl_kernel
    from sgl_kernel import FusedSetKVBufferArg as Arg, apply_rope_with_cos_sin_cache_inplace, rotary_embedding

    assert Arg is FusedSetKVBufferArg and apply_rope_with_cos_sin_cache_inplace is rope_compat.apply_rope_with_cos_sin_cache_inplace
    assert sgl_kernel.__spec__.origin == "rope-compat alias" and rope_compat.patch_status().sgl_kernel_alias
    q = torch.randn(5, 2 * 64)
    k = torch.randn(5, 64)
    cache = random_cache(20, 64, torch.float32)
    positions = torch.randint(0, 20, (5,))
    want_q, want_k = rope_reference(positions, q, k, 64, cache, True)
    rotary_embedding(positions, q, k, 64, cache)
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)
    with pytest.raises(ImportError, match=r"provides only apply_rope_with_cos_sin_cache_inplace.*'silu_and_mul'"):
        from sgl_kernel import silu_and_mul  # noqa: F401
    with pytest.raises(ImportError, match="stand-in"):
        sgl_kernel.fused_add_rmsnorm
    assert not hasattr(sgl_kernel, "__file__")
    with pytest.raises(ModuleNotFoundError):
        import sgl_kernel.flash_attn  # noqa: F401
    assert rope_compat.uninstall_sgl_kernel_alias() and "sgl_kernel" not in sys.modules


def test_sgl_kernel_alias_never_shadows_a_real_one(tmp_path, monkeypatch):
    if sgl_kernel_alias.alias_installed():
        pytest.skip("alias installed elsewhere")
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert rope_compat.install_sgl_kernel_alias() is False
    assert "sgl_kernel" not in sys.modules or not sgl_kernel_alias.alias_installed()
