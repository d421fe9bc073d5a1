"""mrope_rotary_embedding_set_kv: MRoPE plus the KV-cache store, against a float64 reference
(the MRoPE reference composed with the store) and, on CUDA, against the CPU.

The store has rotary_embedding_set_kv's rules (tests/test_fused_kv_store.py checks those in
depth); here every buffer starts poisoned, rows not named by a valid `cache_loc` must come back
bit for bit, and stored rows are exactly the documented conversion of the op's own rotated key
(and of the value), every dim included.
"""

import types

import pytest
import torch

import rope_compat
from rope_compat.ops import extension

from cases import _qk, bits, random_cache
from reference import mrope_reference
from test_fused_kv_store import BAD as STORE_BAD, FP8, _buffer, _check as _check_store, _rows, _stored
from test_mrope import CONFIGS
from tolerances import assert_matches_reference

op = torch.ops.rope_compat.mrope_rotary_embedding_set_kv
HAS_KERNEL = extension.has_cuda_kernel()


def _inputs(device, config="qwen3-vl-8b", dtype=torch.bfloat16, buffer_dtype=None, layout="flat",
            buffer_layout="heads", tokens=13, loc=None, loc_dtype=torch.int64, cache_dtype=torch.float32,
            rows=None, cache_rows=512, pos_dtype=torch.int64):
    heads, kv_heads, head, rot, sections, inter = CONFIGS[config]
    # a [:, :T] slice of a wider buffer, as engines keep MRoPE positions
    positions = torch.randint(0, cache_rows, (3, tokens + 5), dtype=pos_dtype, device=device)[:, :tokens]
    q, k = _qk((tokens,), heads, kv_heads, head, layout, dtype, device)
    kw = kv_heads * head
    if layout.startswith("fused"):  # the value is the third slice of the same qkv tensor
        base = q._base
        value = base[..., heads * head + kw : heads * head + 2 * kw]
    else:
        value = torch.randn(tokens, kw, dtype=dtype, device=device)
    if layout.endswith("heads"):
        value = value.unflatten(-1, (kv_heads, head))
    cache = random_cache(cache_rows, rot, cache_dtype, device)
    rows = rows or 4 * tokens
    if loc is None:
        loc = torch.randperm(rows, device=device)[:tokens]
    loc = loc.to(device=device, dtype=loc_dtype)
    buffer_dtype = buffer_dtype or dtype
    k_buf = _buffer(rows, kv_heads, head, buffer_dtype, buffer_layout, device)
    v_buf = _buffer(rows, kv_heads, head, buffer_dtype, buffer_layout, device)
    return dict(positions=positions, q=q, k=k, head=head, cache=cache, sections=sections, inter=inter,
                value=value, k_buf=k_buf, v_buf=v_buf, loc=loc, kv_heads=kv_heads, rows=rows)


def _call(a, is_neox=True, k_scale=None, v_scale=None, offset=0, fn=None):
    (fn or op)(a["positions"], a["q"], a["k"], a["head"], a["cache"], is_neox, a["sections"], a["value"],
               a["k_buf"], a["v_buf"], a["loc"], k_scale, v_scale, a["inter"], offset)


def _run(device, is_neox=True, k_scale=None, v_scale=None, offset=0, fn=None, **kw):
    """One call on fresh inputs; the record that test_fused_kv_store._check verifies."""
    a = _inputs(device, **kw)
    want_q, want_k = mrope_reference(a["positions"], a["q"], a["k"], a["head"], a["cache"], is_neox,
                                     a["sections"], a["inter"], offset)
    k_before = _rows(a["k_buf"], a["kv_heads"], a["head"]).clone()
    v_before = _rows(a["v_buf"], a["kv_heads"], a["head"]).clone()
    value_before = a["value"].clone()
    _call(a, is_neox, k_scale, v_scale, offset, fn)
    # _check reads the tokens from case.positions: one row of the [3, T] positions stands for them
    case = types.SimpleNamespace(query=a["q"], key=a["k"], positions=a["positions"][0])
    return dict(
        case=case, want_q=want_q, want_k=want_k, value=a["value"], value_before=value_before, loc=a["loc"],
        k_buf=a["k_buf"], v_buf=a["v_buf"], k_before=k_before, v_before=v_before, kv_heads=a["kv_heads"],
        head=a["head"], k_scale=k_scale, v_scale=v_scale, rows=a["rows"], inputs=a,
    )


def _offset(config):
    heads, kv, head, rot, *_ = CONFIGS[config]
    return (head - rot) // 2 // 8 * 8


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference(device, config, is_neox, dtype):
    """Every head shape (pass-through dims stored too where rot_dim < head_size)."""
    _check_store(_run(device, is_neox, config=config, dtype=dtype, offset=_offset(config)))


@pytest.mark.parametrize("buffer_dtype", [None, torch.float32, torch.float64, torch.bfloat16, *FP8], ids=str)
@pytest.mark.parametrize("k_scale, v_scale", [(None, None), (0.37, 2.5), (None, 0.125)])
def test_buffer_dtypes_and_scales(device, buffer_dtype, k_scale, v_scale):
    _check_store(_run(device, k_scale=k_scale, v_scale=v_scale, buffer_dtype=buffer_dtype, config="qwen2.5-vl-7b"))


@pytest.mark.parametrize("layout", ["flat", "heads", "fused_flat", "fused_heads"])
@pytest.mark.parametrize("buffer_layout", ["flat", "heads", "strided", "paged"])
def test_layouts(device, layout, buffer_layout):
    _check_store(_run(device, False, 0.5, None, config="odd-interleaved", layout=layout, buffer_layout=buffer_layout,
                      buffer_dtype=torch.float8_e4m3fn))


@pytest.mark.parametrize("cache_dtype", [torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_cache_and_position_dtypes(device, cache_dtype, pos_dtype):
    _check_store(_run(device, config="odd-contig", cache_dtype=cache_dtype, pos_dtype=pos_dtype, offset=16,
                      dtype=torch.float16))


@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
def test_out_of_range_cache_loc_stores_nothing(device, loc_dtype):
    top = torch.iinfo(loc_dtype).max
    rows = 24
    loc = torch.tensor([-1, 0, rows, 5, top, -top, rows - 1, -2, 7, rows + 1, 11], dtype=torch.int64)
    _check_store(_run(device, loc=loc, loc_dtype=loc_dtype, tokens=11, rows=rows, buffer_layout="paged",
                      buffer_dtype=torch.float8_e5m2, dtype=torch.float16, k_scale=0.5))


@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
def test_duplicate_cache_loc(device, loc_dtype):
    loc = torch.tensor([3, 3, 3, 9, 0, 9, 3, 0, 1], dtype=torch.int64)
    _check_store(_run(device, loc=loc, loc_dtype=loc_dtype, tokens=9, rows=12), duplicates_ok=True)


def test_paged_buffers_use_slot_index(device):
    loc = torch.tensor([0, 5, 7, 8, 13], dtype=torch.int64)  # pages 0, 1, 1, 2, 3 of 4 slots
    r = _run(device, loc=loc, tokens=5, rows=16, buffer_layout="paged", buffer_dtype=torch.float8_e4m3fn,
             k_scale=0.25, v_scale=0.5, config="qwen2-vl-small")
    _check_store(r)
    got = r["k_buf"][13 // 4, 13 % 4].cpu()
    want = _stored(r["case"].key.reshape(5, 2, 128)[4].cpu(), 0.25, got.dtype)
    assert torch.equal(bits(got), bits(want))


def test_is_mrope_then_store(device):
    """Bit for bit: mrope_rotary_embedding, then the rows stored as documented; and with t = h = w
    the same as rotary_embedding_set_kv."""
    a = _inputs(device, tokens=21, buffer_dtype=torch.float8_e4m3fn)
    q2, k2, kb2, vb2 = a["q"].clone(), a["k"].clone(), a["k_buf"].clone(), a["v_buf"].clone()
    _call(a, True, 0.5, 2.0)
    rope_compat.mrope_rotary_embedding(a["positions"], q2, k2, a["head"], a["cache"], True, a["sections"],
                                       a["inter"])
    assert torch.equal(a["q"], q2) and torch.equal(a["k"], k2)
    loc = a["loc"].long()
    rows = lambda b: _rows(b, a["kv_heads"], a["head"])  # noqa: E731
    rows(kb2)[loc] = _stored(k2.reshape(21, a["kv_heads"], a["head"]), 0.5, kb2.dtype)
    rows(vb2)[loc] = _stored(a["value"].reshape(21, a["kv_heads"], a["head"]), 2.0, vb2.dtype)
    assert torch.equal(bits(a["k_buf"]), bits(kb2)) and torch.equal(bits(a["v_buf"]), bits(vb2))

    b = _inputs(device, tokens=9, config="odd-contig")
    b["positions"] = b["positions"][:1].expand(3, -1).contiguous()
    q3, k3, kb3, vb3 = b["q"].clone(), b["k"].clone(), b["k_buf"].clone(), b["v_buf"].clone()
    _call(b, False, None, 0.75, 16)
    rope_compat.rotary_embedding_set_kv(b["positions"][0], q3, k3, b["head"], b["cache"], False, b["value"], kb3,
                                        vb3, b["loc"], None, 0.75, 16)
    for got, want in ((b["q"], q3), (b["k"], k3), (b["k_buf"], kb3), (b["v_buf"], vb3)):
        assert torch.equal(bits(got), bits(want))


def test_public_function_and_empty(device):
    _check_store(_run(device, fn=rope_compat.mrope_rotary_embedding_set_kv, config="mqa-tiny", tokens=6,
                      k_scale=2.0))
    a = _inputs(device, tokens=0, rows=4)
    k_before = bits(a["k_buf"]).clone()
    _call(a, fn=rope_compat.mrope_rotary_embedding_set_kv)  # no tokens: nothing to do
    assert torch.equal(bits(a["k_buf"]), k_before)


def test_cpu_position_out_of_range_raises_before_writing():
    a = _inputs("cpu", tokens=6)
    a["positions"][1, 4] = a["cache"].shape[0]
    before = [bits(t).clone() for t in (a["q"], a["k"], a["k_buf"], a["v_buf"])]
    with pytest.raises(IndexError, match=r"positions: cache rows must lie in \[0, 512\)"):
        _call(a)
    for old, t in zip(before, (a["q"], a["k"], a["k_buf"], a["v_buf"])):
        assert torch.equal(old, bits(t))


# ---------------------------------------------------------------- errors


def _error_inputs(device):
    """The error inputs of test_fused_kv_store (6 tokens, 4 heads, 2 kv heads of 32) with MRoPE positions."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 128, generator=g).half().to(device)
    k = torch.randn(6, 64, generator=g).half().to(device)
    positions = torch.randint(0, 16, (3, 6), generator=g).to(device)
    cache = random_cache(16, 32, torch.float32, device)
    args = dict(
        positions=positions, query=q, key=k, head_size=32, cos_sin_cache=cache, is_neox=True,
        mrope_section=[4, 6, 6], value=torch.randn(6, 64, generator=g).half().to(device),
        k_buffer=torch.randn(12, 2, 32, generator=g).half().to(device),
        v_buffer=torch.randn(12, 2, 32, generator=g).half().to(device),
        cache_loc=torch.arange(6, device=device), k_scale=None, v_scale=None, mrope_interleaved=False,
        rope_dim_offset=0,
    )
    return args


MROPE_BAD = [
    ("positions", lambda a: a["positions"][0], ValueError, r"positions: expected shape \[3, num_tokens\]"),
    ("positions", lambda a: a["positions"].float(), TypeError, "positions: expected dtype int32 or int64"),
    ("positions", lambda a: a["positions"][:, :5], ValueError, r"query: leading dims \(6,\) must match"),
    ("mrope_section", lambda a: [4, 6, 5], ValueError,
     r"mrope_section: expected 3 non-negative sections summing to rot_dim / 2 = 16, got \[4, 6, 5\]"),
    ("mrope_section", lambda a: [16], ValueError, r"got \[16\]"),
    ("key", lambda a: torch.randn(6, 96, device=a["key"].device).half(), ValueError, r"must be a multiple of key heads"),
    ("rope_dim_offset", lambda a: 8, ValueError, "exceeds head_size=32"),
]
ALL_BAD = [(n, f, e, m) for n, f, e, m in STORE_BAD] + MROPE_BAD
IDS = [f"{n}-{i}" for i, (n, *_) in enumerate(ALL_BAD)]


def _apply(fn, a):
    fn(*a.values())


def _written(a):
    return [a[n] for n in ("query", "key", "k_buffer", "v_buffer")]


def _expect_error(fn, args, exc, match):
    before = [bits(t).clone() for t in _written(args) if t.device.type != "meta"]
    with pytest.raises(exc, match=match) as info:
        _apply(fn, args)
    after = [t for t in _written(args) if t.device.type != "meta"]
    for old, new in zip(before, after):
        assert torch.equal(old, bits(new)), "written before the error"
    return str(info.value)


@pytest.mark.parametrize("name, bad, exc, match", ALL_BAD, ids=IDS)
def test_bad_input_raises_before_anything_is_written(device, name, bad, exc, match):
    """The op and the public function raise the same type and text, and the store's errors are
    rotary_embedding_set_kv's own."""
    messages = []
    for fn in (op, rope_compat.mrope_rotary_embedding_set_kv):
        args = _error_inputs(device)
        args[name] = bad(args)
        messages.append(_expect_error(fn, args, exc, match))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("name, bad, exc, match", ALL_BAD, ids=IDS)
def test_fake_impl_checks_the_same(name, bad, exc, match):
    args = _error_inputs("cpu")
    args[name] = bad(args)
    with torch._subclasses.FakeTensorMode() as mode:
        fake = {n: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                for n, v in args.items()}
        with pytest.raises(exc, match=match):
            _apply(op, fake)


def test_requires_grad_refused_before_writing():
    args = _error_inputs("cpu")
    args["v_buffer"] = args["v_buffer"].float().requires_grad_()
    args["k_buffer"] = args["k_buffer"].float()
    for fn in (op, rope_compat.mrope_rotary_embedding_set_kv):
        _expect_error(fn, args, RuntimeError, "v_buffer: requires grad, but rope_compat's in-place ops")


TYPE_BAD = [
    ("mrope_section", 16, "mrope_section: expected a list of ints, got int"),
    ("mrope_section", [4, 6.0, 6], "mrope_section: expected an int (64-bit), got float"),
    ("value", None, "value: expected a torch.Tensor, got NoneType"),
    ("k_scale", "2", "k_scale: expected a float or None, got str"),
    ("mrope_interleaved", None, "mrope_interleaved: expected a bool, got NoneType"),
    ("rope_dim_offset", 1.5, "rope_dim_offset: expected an int (64-bit), got float"),
]


@pytest.mark.parametrize("name, bad, message", TYPE_BAD, ids=[t[0] for t in TYPE_BAD])
def test_public_function_names_bad_types(device, name, bad, message):
    args = _error_inputs(device)
    args[name] = bad
    got = _expect_error(rope_compat.mrope_rotary_embedding_set_kv, args, TypeError, None)
    assert got == message


def test_opcheck():
    args = _error_inputs("cpu")
    args["k_scale"] = 0.5
    args["cache_loc"] = torch.tensor([3, -1, 0, 11, 12, 7])
    torch.library.opcheck(op, tuple(args.values()))
    # float32 buffers (opcheck's schema check compares tensors with ops float8 lacks on the CPU)
    args["k_buffer"] = args["k_buffer"].float().view(3, 4, 2, 32)
    args["v_buffer"] = args["v_buffer"].float()
    args["mrope_interleaved"] = True
    torch.library.opcheck(op, tuple(args.values()))


def test_compile_fullgraph_cpu():
    torch._dynamo.reset()
    a = _inputs("cpu", config="odd-interleaved", tokens=7, dtype=torch.float32, buffer_dtype=torch.float8_e4m3fn)
    heads, kv, head = 3, 3, 64

    def block(positions, qkv, cache, k_buf, v_buf, loc):
        q, k, v = qkv.split([heads * head, kv * head, kv * head], dim=-1)
        rope_compat.mrope_rotary_embedding_set_kv(positions, q, k, head, cache, True, a["sections"], v, k_buf,
                                                  v_buf, loc, 0.5, None, True)
        return (q * 2).sum(-1)

    qkv = torch.randn(7, (heads + 2 * kv) * head)
    inputs = [a["positions"], qkv, a["cache"], a["k_buf"], a["v_buf"], a["loc"]]
    eager = [t.clone() for t in inputs]
    got = torch.compile(block, fullgraph=True, backend="aot_eager")(*inputs)
    want = block(*eager)
    torch.testing.assert_close(got, want)
    for x, y in zip(inputs, eager):
        assert torch.equal(bits(x), bits(y))
    torch._dynamo.reset()


# ---------------------------------------------------------------- CUDA

gpu = pytest.mark.gpu
needs_kernel = pytest.mark.skipif(not HAS_KERNEL, reason="the CUDA kernel is not built")


@gpu
@needs_kernel
def test_cuda_kernel_is_registered():
    assert torch._C._dispatch_has_kernel_for_dispatch_key("rope_compat::mrope_rotary_embedding_set_kv", "CUDA")
    assert hasattr(extension.direct_binding(), "mrope_set_kv_launch")


@gpu
@needs_kernel
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("buffer_dtype", [None, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("tokens", [1, 64, 3000])
def test_cuda_kernel_matches_reference(config, is_neox, dtype, buffer_dtype, tokens):
    """Both vector widths (16-byte and scalar: odd sizes), decode and prefill sizes, poisoned
    buffers; stored rows exactly the conversion of the rotated key, every other row untouched."""
    scales = (0.7, 1.3) if buffer_dtype is not None else (None, None)
    r = _run("cuda", is_neox, *scales, offset=_offset(config), config=config, dtype=dtype,
             buffer_dtype=buffer_dtype, tokens=tokens, buffer_layout="paged", layout="fused_heads")
    _check_store(r)


@gpu
@needs_kernel
@pytest.mark.parametrize("buffer_dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("config", ["qwen2.5-vl-7b", "odd-contig"])
def test_cuda_same_as_cpu(buffer_dtype, config):
    a = _inputs("cuda", config=config, tokens=77, buffer_dtype=buffer_dtype, layout="fused_flat",
                buffer_layout="paged", loc=torch.cat([torch.randperm(300)[:70], torch.tensor([-1] * 4 + [300] * 3)]),
                rows=300)
    c = {n: (v.cpu().clone() if isinstance(v, torch.Tensor) else v) for n, v in a.items()}
    _call(a, True, 0.5, 0.25, _offset(config))
    _call(c, True, 0.5, 0.25, _offset(config))
    for n in ("q", "k"):
        assert_matches_reference(a[n], c[n].double())
    # the stored rows are the conversion of each device's own key: equal where the keys are equal
    same = (a["k"].cpu() == c["k"]).reshape(77, -1).all(-1)
    loc = c["loc"].long()
    keep = same & (loc >= 0) & (loc < 300)
    kr, kc = _rows(a["k_buf"], a["kv_heads"], a["head"]).cpu(), _rows(c["k_buf"], a["kv_heads"], a["head"])
    assert torch.equal(bits(kr[loc[keep]]), bits(kc[loc[keep]]))
    vr, vc = _rows(a["v_buf"], a["kv_heads"], a["head"]).cpu(), _rows(c["v_buf"], a["kv_heads"], a["head"])
    assert torch.equal(bits(vr), bits(vc))


@gpu
@needs_kernel
@pytest.mark.parametrize("config", ["qwen3-vl-8b", "qwen2.5-vl-7b"])  # per-pair and one-row cos/sin loads
def test_cuda_out_of_range_position_stores_key_unrotated(config):
    a = _inputs("cuda", config=config, tokens=40)
    a["positions"][1, 7] = a["cache"].shape[0]
    a["positions"][2, 9] = -1
    q0, k0 = a["q"].clone(), a["k"].clone()
    _call(a)
    assert torch.equal(a["q"][[7, 9]], q0[[7, 9]]) and torch.equal(a["k"][[7, 9]], k0[[7, 9]])
    rows = _rows(a["k_buf"], a["kv_heads"], a["head"])
    loc = a["loc"].long()
    assert torch.equal(rows[loc[[7, 9]]], k0[[7, 9]].reshape(2, a["kv_heads"], a["head"]))


@gpu
@needs_kernel
@pytest.mark.parametrize("name, bad, exc, match", ALL_BAD, ids=IDS)
def test_cuda_errors_same_as_python_checks(name, bad, exc, match):
    """The C++ entry's message equals the Python checks' on the same CUDA tensors."""
    args = _error_inputs("cuda")
    args[name] = bad(args)
    python_msg = _expect_error(rope_compat.ops.mrope.mrope_rotary_embedding_set_kv, args, exc, match)
    for fn in (op, rope_compat.mrope_rotary_embedding_set_kv):  # the dispatcher, and the direct path
        args = _error_inputs("cuda")
        args[name] = bad(args)
        assert _expect_error(fn, args, exc, match) == python_msg


@gpu
@needs_kernel
@pytest.mark.parametrize("name, bad, message", TYPE_BAD, ids=[t[0] for t in TYPE_BAD])
def test_cuda_direct_path_names_bad_types(name, bad, message):
    args = _error_inputs("cuda")
    args[name] = bad
    assert _expect_error(rope_compat.mrope_rotary_embedding_set_kv, args, TypeError, None) == message
    assert _expect_error(extension.direct_binding().mrope_set_kv_launch, args, TypeError, None) == message


@gpu
@needs_kernel
@pytest.mark.parametrize("buffer_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_cuda_graph_no_sync_no_allocation(buffer_dtype):
    cases = [_inputs("cuda", config=c, tokens=t, buffer_dtype=buffer_dtype, layout="fused_flat", rows=400,
                     buffer_layout="paged")
             for c, t in (("qwen2.5-vl-7b", 1), ("qwen3-vl-8b", 17), ("odd-interleaved", 300))]
    for a in cases:  # warm-up
        _call(a, True, 0.5, 0.25)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for a in cases:
            _call(a, True, 0.5, 0.25)
            _call(a, True, 0.5, 0.25, fn=rope_compat.mrope_rotary_embedding_set_kv)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocated
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for a in cases:
            _call(a, True, 0.5, 0.25)
    names = ("q", "k", "k_buf", "v_buf")
    for _ in range(3):
        snapshots = []
        for a in cases:  # fresh inputs written into the captured tensors
            a["positions"].random_(0, a["cache"].shape[0])
            a["q"].normal_()
            a["k"].normal_()
            a["value"].normal_()
            a["loc"].copy_(torch.randperm(400, device="cuda")[: a["loc"].numel()])
            snapshots.append([a[n].clone() for n in names])
        graph.replay()
        torch.cuda.synchronize()
        for a, snap in zip(cases, snapshots):
            replayed = [a[n].clone() for n in names]
            for n, t in zip(names, snap):  # the same call eagerly, on the same tensors
                a[n].copy_(t)
            _call(a, True, 0.5, 0.25)
            for n, got in zip(names, replayed):
                assert torch.equal(bits(got), bits(a[n])), n
