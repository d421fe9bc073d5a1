"""rotary_embedding_set_kv: rope plus the KV-cache store, against a float64 reference.

Every buffer starts poisoned (random values): rows not named by a valid `cache_loc` must come
back bit for bit. Stored rows are checked two ways: exactly, as the documented conversion of
the op's own rotated key (key / k_scale in float32, rounded once to the buffer dtype), and
approximately against the float64 reference rotation.
"""

import math
from typing import Optional

import pytest
import torch

import rope_compat
from rope_compat.ops import extension

from cases import bits, make_case
from reference import rope_reference
from tolerances import assert_matches_reference

op = torch.ops.rope_compat.rotary_embedding_set_kv
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# Tolerances of a stored row against the float64 reference, in the scaled domain: the key's
# own rounding plus one rounding to the buffer dtype.
BUFFER_TOL = {
    torch.float32: dict(rtol=2e-6, atol=1e-5),
    torch.float64: dict(rtol=2e-6, atol=1e-5),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
    torch.float8_e4m3fn: dict(rtol=0.075, atol=2e-2),
    torch.float8_e5m2: dict(rtol=0.14, atol=2e-2),
}


def _buffer(rows: int, kv_heads: int, head: int, dtype, layout: str, device) -> torch.Tensor:
    """A poisoned buffer of `rows` rows in one of the accepted layouts."""
    if layout == "flat":
        t = torch.randn(rows, kv_heads * head, device=device)
    elif layout == "heads":
        t = torch.randn(rows, kv_heads, head, device=device)
    elif layout == "strided":  # padded rows and heads: row and head strides of their own
        t = torch.randn(rows, kv_heads, head + 8, device=device)[:, :, :head]
    else:  # paged: [pages, page_size, heads, head]
        assert rows % 4 == 0
        t = torch.randn(rows // 4, 4, kv_heads, head, device=device)
    return t.to(dtype) if dtype != torch.float32 else t


def _rows(buf: torch.Tensor, kv_heads: int, head: int) -> torch.Tensor:
    return buf.reshape(-1, kv_heads, head)


def _stored(x: torch.Tensor, scale: Optional[float], dtype) -> torch.Tensor:
    return (x.float() / scale if scale is not None else x).to(dtype)


def _run(
    device, dtype=torch.bfloat16, buffer_dtype=None, layout="flat", is_neox=True, heads=4, kv_heads=2,
    head=64, rot_dim=None, offset=0, buffer_layout="heads", tokens=13, loc=None, loc_dtype=torch.int64,
    k_scale=None, v_scale=None, cache_dtype=torch.float32, rows=None,
):
    buffer_dtype = buffer_dtype or dtype
    rot_dim = rot_dim or head
    case = make_case(
        tokens=(tokens,), heads=heads, kv_heads=kv_heads, head_size=head, rot_dim=rot_dim,
        rope_dim_offset=offset, is_neox=is_neox, dtype=dtype, cache_dtype=cache_dtype, layout=layout,
        device=device,
    )
    kw = kv_heads * head
    if layout.startswith("fused"):  # the value is the third slice of the same qkv tensor
        base = case.query._base
        value = base[..., heads * head + kw : heads * head + 2 * kw]
    else:
        value = torch.randn(tokens, kw, dtype=dtype, device=device)
    if layout.endswith("heads"):
        value = value.unflatten(-1, (kv_heads, head))
    rows = rows or 4 * tokens
    if loc is None:
        loc = torch.randperm(rows, device=device)[:tokens]
    loc = loc.to(device=device, dtype=loc_dtype)
    k_buf = _buffer(rows, kv_heads, head, buffer_dtype, buffer_layout, device)
    v_buf = _buffer(rows, kv_heads, head, buffer_dtype, buffer_layout, device)
    k_before, v_before = _rows(k_buf, kv_heads, head).clone(), _rows(v_buf, kv_heads, head).clone()
    want_q, want_k = rope_reference(*case.args())
    value_before = value.clone()
    op(case.positions, case.query, case.key, head, case.cos_sin_cache, is_neox, value, k_buf, v_buf, loc,
       k_scale, v_scale, offset)
    return dict(
        case=case, want_q=want_q, want_k=want_k, value=value, value_before=value_before, loc=loc,
        k_buf=k_buf, v_buf=v_buf, k_before=k_before, v_before=v_before, kv_heads=kv_heads, head=head,
        k_scale=k_scale, v_scale=v_scale, rows=rows,
    )


def _check(r, duplicates_ok: bool = False) -> None:
    """q/k against the reference; the buffers exactly as documented, poison kept elsewhere."""
    case, kv_heads, head = r["case"], r["kv_heads"], r["head"]
    assert_matches_reference(case.query, r["want_q"])
    assert_matches_reference(case.key, r["want_k"])
    assert torch.equal(r["value"], r["value_before"]), "the value must not change"
    tokens = case.positions.numel()
    loc = r["loc"].cpu().long()
    for name, buf, before, src, want, scale in (
        ("k_buffer", r["k_buf"], r["k_before"], case.key, r["want_k"], r["k_scale"]),
        ("v_buffer", r["v_buf"], r["v_before"], r["value"], r["value"].double(), r["v_scale"]),
    ):
        got = _rows(buf, kv_heads, head).cpu()
        src_rows = src.reshape(tokens, kv_heads, head).cpu()
        exact = _stored(src_rows, scale, buf.dtype)
        approx = want.reshape(tokens, kv_heads, head).cpu() / (scale or 1.0)
        expected = bits(before).clone()
        written = torch.zeros(got.shape[0], dtype=torch.bool)
        for t, row in enumerate(loc.tolist()):
            if 0 <= row < got.shape[0]:
                expected[row] = bits(exact[t])
                written[row] = True
                if not duplicates_ok:
                    tol = {k: max(BUFFER_TOL[buf.dtype][k], BUFFER_TOL[src.dtype][k]) for k in ("rtol", "atol")}
                    torch.testing.assert_close(
                        got[row].double(), approx[t], **tol, msg=lambda m, name=name, row=row: f"{name} row {row}: {m}"
                    )
        got_bits = bits(got)
        assert torch.equal(got_bits[~written], expected[~written]), f"{name}: an unnamed row changed"
        if not duplicates_ok:
            assert torch.equal(got_bits[written], expected[written]), f"{name}: stored rows differ"
        else:  # each element of a shared row comes from one of the tokens that name it
            for row in loc.unique().tolist():
                if not 0 <= row < got.shape[0]:
                    continue
                candidates = torch.stack([bits(exact[t]) for t in (loc == row).nonzero().flatten().tolist()])
                assert (candidates == got_bits[row]).any(0).all(), f"{name} row {row}: not any token's element"


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BUFFER_DTYPES = [None, torch.float32, torch.bfloat16, torch.float64, *FP8]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("buffer_dtype", BUFFER_DTYPES, ids=str)
def test_buffer_dtypes(device, dtype, buffer_dtype):
    _check(_run(device, dtype, buffer_dtype))


@pytest.mark.parametrize("layout", ["flat", "heads", "fused_flat", "fused_heads"])
@pytest.mark.parametrize("buffer_layout", ["flat", "heads", "strided", "paged"])
@pytest.mark.parametrize("is_neox", [True, False])
def test_layouts(device, layout, buffer_layout, is_neox):
    _check(_run(device, torch.bfloat16, layout=layout, buffer_layout=buffer_layout, is_neox=is_neox))


@pytest.mark.parametrize(
    "heads, kv_heads, head, rot_dim, offset, is_neox",
    [
        (8, 1, 64, 64, 0, True),  # MQA
        (6, 3, 128, 64, 0, True),  # partial rotation: pass-through dims stored too
        (4, 2, 128, 64, 32, False),  # rope_dim_offset, GPT-J
        (5, 5, 40, 24, 8, True),  # odd sizes: scalar accesses
        (3, 1, 80, 16, 64, False),  # rotated dims at the end
        (2, 2, 256, 256, 0, False),
    ],
)
@pytest.mark.parametrize("buffer_dtype", [None, torch.float8_e4m3fn], ids=str)
def test_head_shapes(device, heads, kv_heads, head, rot_dim, offset, is_neox, buffer_dtype):
    _check(_run(device, torch.bfloat16, buffer_dtype, heads=heads, kv_heads=kv_heads, head=head,
                rot_dim=rot_dim, offset=offset, is_neox=is_neox, buffer_layout="flat"))


@pytest.mark.parametrize("buffer_dtype", [torch.bfloat16, torch.float16, *FP8], ids=str)
@pytest.mark.parametrize("k_scale, v_scale", [(0.37, 2.5), (3.0, None), (None, 0.125)])
def test_scales(device, buffer_dtype, k_scale, v_scale):
    _check(_run(device, torch.bfloat16, buffer_dtype, k_scale=k_scale, v_scale=v_scale))


# float8 rounding at its edges, as torch's conversion does it: e4m3fn has no infinity (anything
# that rounds above 448 is NaN), e5m2 overflows to infinity from 61440; NaN keeps its sign.
FP8_EDGES = [float("nan"), -float("nan"), float("inf"), -float("inf"), 448.0, 463.9, 464.0, 464.1, 470.0,
             480.0, -500.0, 57344.0, 61439.0, 61440.0, -61440.0, 1e30, 3e38, 2.0 ** -10, 2.0 ** -17,
             -2.0 ** -17, 0.0, -0.0, 1.0, 1.1]


@pytest.mark.parametrize("buffer_dtype", FP8, ids=str)
@pytest.mark.parametrize("head", [64, 66])  # 16-byte vectors, and the scalar path
@pytest.mark.parametrize("v_scale", [None, 0.3, 1e-6])
def test_float8_edges_match_torch(device, buffer_dtype, head, v_scale):
    tokens, kv_heads = 5, 2
    edges = torch.tensor(FP8_EDGES, dtype=torch.float32)
    value = edges.repeat(tokens * kv_heads * head // len(edges) + 1)[: tokens * kv_heads * head]
    value = value[torch.randperm(value.numel())].view(tokens, kv_heads, head).to(device)
    r = _run(device, torch.float32, buffer_dtype, heads=2, kv_heads=kv_heads, head=head, tokens=tokens,
             v_scale=v_scale)
    # The same call with the edge values as the value: rows must equal torch's conversion bit for bit.
    k_buf, v_buf = r["k_buf"], r["v_buf"]
    case = r["case"]
    op(case.positions, case.query, case.key, head, case.cos_sin_cache, True, value, k_buf, v_buf, r["loc"],
       None, v_scale)
    want = bits(_stored(value.cpu(), v_scale, buffer_dtype))
    got = bits(_rows(v_buf, kv_heads, head).cpu()[r["loc"].cpu().long()])
    assert torch.equal(got, want)


@pytest.mark.parametrize("buffer_dtype", FP8, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("k_scale", [None, 0.3])
def test_float8_key_rows_at_the_edges(device, buffer_dtype, dtype, k_scale):
    """Key rows with bytes the float8 fast path may not store, next to rows without: the two
    vectors of a rotated pair are converted together, and each must still equal torch's
    conversion of the rotated key bit for bit."""
    tokens, kv_heads, head = 6, 2, 64
    half = head // 2
    r = _run(device, dtype, buffer_dtype, heads=2, kv_heads=kv_heads, head=head, tokens=tokens, k_scale=k_scale)
    case, k_buf, v_buf, loc = r["case"], r["k_buf"], r["v_buf"], r["loc"]
    # Even tokens at an identity row (cos 1, sin 0): finite edges in the first half of head 0
    # reach only that half, so one vector of a pair is special and its partner is not.
    case.cos_sin_cache[0, :half], case.cos_sin_cache[0, half:] = 1, 0
    case.positions[::2] = 0
    key = case.key.view(tokens, kv_heads, head)
    key.copy_(torch.randn(tokens, kv_heads, head, device=device).to(dtype))
    finite = torch.tensor([e for e in FP8_EDGES if math.isfinite(e) and abs(e) >= 448], dtype=dtype)
    key[0::2, 0, 1:half:3] = finite.repeat(half)[: len(range(1, half, 3))].to(device)
    # Odd tokens at random rows: every edge, NaN and infinity included, in one dim of head 1.
    edges = torch.tensor(FP8_EDGES, dtype=dtype)
    key[1::2, 1, 5] = edges[torch.randperm(len(edges))[: len(range(1, tokens, 2))]].to(device)
    op(case.positions, case.query, case.key, head, case.cos_sin_cache, True, r["value"], k_buf, v_buf, loc,
       k_scale, None)
    want = bits(_stored(key.cpu(), k_scale, buffer_dtype))
    got = bits(_rows(k_buf, kv_heads, head).cpu()[loc.cpu().long()])
    assert torch.equal(got, want)


# NaNs with payloads and both signs, as bit patterns of each dtype.
NAN_BITS = {
    torch.float32: [0x7F800001, 0xFFC00005, 0x7FC12345],
    torch.float16: [0x7C01, 0xFE05, 0x7E31],
    torch.bfloat16: [0x7F81, 0xFFC5, 0x7FC3],
}


def _nans(shape, dtype) -> torch.Tensor:
    """A CPU tensor of `shape` holding the NaNs of NAN_BITS[dtype] in turn."""
    width = 8 * dtype.itemsize
    signed = [b - (1 << width) if b >= 1 << (width - 1) else b for b in NAN_BITS[dtype]]
    n = math.prod(shape)
    ints = torch.tensor(signed * (n // len(signed) + 1))[:n].view(shape)
    return ints.to(torch.int16 if width == 16 else torch.int32).view(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head", [64, 66])  # 16-byte vectors, and the scalar path
def test_rows_of_the_keys_dtype_keep_their_bits(device, dtype, head):
    """No scale and a buffer of the key's dtype: the value and the key's pass-through dims are
    stored bit for bit, NaN payloads and signs included (no round trip through float)."""
    tokens, kv_heads, rot_dim = 5, 2, 32
    r = _run(device, dtype, heads=2, kv_heads=kv_heads, head=head, rot_dim=rot_dim, tokens=tokens)
    case, k_buf, v_buf, loc = r["case"], r["k_buf"], r["v_buf"], r["loc"]
    value = torch.randn(tokens, kv_heads, head).to(dtype)
    value[..., ::7] = _nans(value[..., ::7].shape, dtype)
    value = value.to(device)
    key = case.key.unflatten(-1, (kv_heads, head))
    key[..., rot_dim::5] = _nans(key[..., rot_dim::5].shape, dtype).to(device)
    key_before = bits(key)
    op(case.positions, case.query, case.key, head, case.cos_sin_cache, True, value, k_buf, v_buf, loc)
    rows = loc.cpu().long()
    assert torch.equal(bits(_rows(v_buf, kv_heads, head))[rows], bits(value))
    assert torch.equal(bits(_rows(k_buf, kv_heads, head))[rows][..., rot_dim:], key_before[..., rot_dim:])


@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
def test_out_of_range_cache_loc_stores_nothing(device, loc_dtype):
    top = torch.iinfo(loc_dtype).max
    rows = 24
    loc = torch.tensor([-1, 0, rows, 5, top, -top, rows - 1, -2, 7, rows + 1, 11], dtype=torch.int64)
    r = _run(device, torch.float16, torch.float8_e5m2, loc=loc, loc_dtype=loc_dtype, tokens=11, rows=rows,
             buffer_layout="paged", k_scale=0.5)
    _check(r)  # valid tokens stored, every other row bit-identical; q and k rotated for all


@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
def test_duplicate_cache_loc(device, loc_dtype):
    loc = torch.tensor([3, 3, 3, 9, 0, 9, 3, 0, 1], dtype=torch.int64)
    _check(_run(device, torch.bfloat16, loc=loc, loc_dtype=loc_dtype, tokens=9, rows=12), duplicates_ok=True)


def test_paged_buffers_use_slot_index(device):
    loc = torch.tensor([0, 5, 7, 8, 13], dtype=torch.int64)  # pages 0, 1, 1, 2, 3 of 4 slots
    r = _run(device, torch.bfloat16, torch.float8_e4m3fn, loc=loc, tokens=5, rows=16, buffer_layout="paged",
             k_scale=0.25, v_scale=0.5)
    _check(r)
    page, slot = 13 // 4, 13 % 4
    got = r["k_buf"][page, slot].cpu()
    assert torch.equal(bits(got), bits(_stored(r["case"].key.reshape(5, 2, 64)[4].cpu(), 0.25, got.dtype)))


def test_two_dim_positions(device):
    case = make_case(tokens=(2, 5), heads=4, kv_heads=2, head_size=32, dtype=torch.float16, device=device)
    value = torch.randn(2, 5, 64, dtype=torch.float16, device=device)
    k_buf = torch.randn(20, 2, 32, device=device).half()
    v_buf = torch.randn(20, 2, 32, device=device).half()
    k_before = k_buf.clone()
    loc = torch.randperm(20, device=device)[:10].view(2, 5)
    want_q, want_k = rope_reference(*case.args())
    op(case.positions, case.query, case.key, 32, case.cos_sin_cache, True, value, k_buf, v_buf, loc)
    assert_matches_reference(case.query, want_q)
    expected = k_before.clone()
    expected[loc.flatten()] = case.key.reshape(10, 2, 32)
    assert torch.equal(k_buf, expected)
    assert torch.equal(v_buf[loc.flatten()], value.reshape(10, 2, 32))


def test_public_function_is_the_op(device):
    case = make_case(tokens=(4,), heads=2, kv_heads=1, head_size=32, device=device)
    value = torch.randn(4, 32, device=device)
    k_buf, v_buf = torch.randn(2, 8, 32, device=device).unbind(0)
    loc = torch.tensor([6, -1, 2, 7], device=device)
    want_q, want_k = rope_reference(*case.args())
    rope_compat.rotary_embedding_set_kv(case.positions, case.query, case.key, 32, case.cos_sin_cache, True, value,
                                        k_buf, v_buf, loc, v_scale=4.0)
    assert_matches_reference(case.query, want_q)
    assert torch.equal(k_buf[loc[[0, 2, 3]]], case.key[[0, 2, 3]])
    assert torch.equal(v_buf[loc[[0, 2, 3]]], value[[0, 2, 3]] / 4.0)


def test_public_api_routes_scales_to_the_op(device):
    case = make_case(tokens=(7,), heads=4, kv_heads=2, head_size=64, dtype=torch.bfloat16, device=device)
    value = torch.randn(7, 2, 64, dtype=torch.bfloat16, device=device)
    k_buf = torch.randn(16, 2, 64, device=device).to(torch.float8_e4m3fn)
    v_buf = torch.randn(16, 2, 64, device=device).to(torch.float8_e4m3fn)
    loc = torch.tensor([1, 4, 0, 15, 9, 2, 3], dtype=torch.int32, device=device)
    arg = rope_compat.FusedSetKVBufferArg(value, k_buf, v_buf, 0.5, 2.0, loc)
    rope_compat.apply_rope_with_cos_sin_cache_inplace(
        case.positions, case.query, case.key, 64, case.cos_sin_cache, True, fused_set_kv_buffer_arg=arg
    )
    assert torch.equal(bits(k_buf[loc.long()]), bits(_stored(case.key.view(7, 2, 64), 0.5, k_buf.dtype)))
    assert torch.equal(bits(v_buf[loc.long()]), bits(_stored(value, 2.0, v_buf.dtype)))


# ---- Errors: each bad input itself, raised before anything is written, same on every device.

def _error_inputs(device):
    case = make_case(tokens=(6,), heads=4, kv_heads=2, head_size=32, dtype=torch.float16, device=device)
    value = torch.randn(6, 64, dtype=torch.float16, device=device)
    k_buf = torch.randn(12, 2, 32, device=device).half()
    v_buf = torch.randn(12, 2, 32, device=device).half()
    loc = torch.arange(6, device=device)
    return case, dict(value=value, k_buffer=k_buf, v_buffer=v_buf, cache_loc=loc, k_scale=None, v_scale=None)


BAD = [
    ("value", lambda a: a["value"].float(), TypeError, "value: dtype torch.float32 must equal the key's dtype"),
    ("value", lambda a: a["value"][:, :32], ValueError, "value: 1 heads, the key has 2"),
    ("value", lambda a: a["value"][:5], ValueError, r"value: leading dims \(5,\) must match"),
    ("value", lambda a: a["value"].reshape(-1), ValueError, "value: expected 2 dims"),
    ("k_buffer", lambda a: a["k_buffer"].to(torch.int16), TypeError, "k_buffer: expected dtype float32"),
    ("v_buffer", lambda a: a["v_buffer"].float(), TypeError, "v_buffer: dtype torch.float32 must equal k_buffer's"),
    ("k_buffer", lambda a: a["k_buffer"][:, :1], ValueError, r"k_buffer: expected \[rows, heads \* head_size\]"),
    ("v_buffer", lambda a: a["v_buffer"].reshape(12, 2, 2, 16), ValueError, "v_buffer: expected"),
    ("k_buffer", lambda a: a["k_buffer"].reshape(12, 64)[:, :60], ValueError, "k_buffer: expected"),
    ("v_buffer", lambda a: a["v_buffer"].transpose(1, 2).contiguous().transpose(1, 2), ValueError,
     r"v_buffer: last dim must be contiguous"),
    ("k_buffer", lambda a: a["k_buffer"].view(3, 4, 2, 32)[:, :2], ValueError, "k_buffer: page stride 256 must be"),
    ("cache_loc", lambda a: a["cache_loc"].float(), TypeError, "cache_loc: expected dtype int32 or int64"),
    ("cache_loc", lambda a: a["cache_loc"][:5], ValueError, "cache_loc: expected a contiguous tensor of 6"),
    ("cache_loc", lambda a: torch.arange(12, device=a["cache_loc"].device)[::2], ValueError,
     "cache_loc: expected a contiguous"),
    ("cache_loc", lambda a: a["cache_loc"].to("meta"), ValueError, "cache_loc: on device meta"),
    ("k_scale", lambda a: -1.0, ValueError, "k_scale: must be a positive finite float or None, got -1.0"),
    ("v_scale", lambda a: float("nan"), ValueError, "v_scale: must be a positive finite float or None, got nan"),
    ("k_scale", lambda a: float("inf"), ValueError, "k_scale: must be a positive finite float or None, got inf"),
]


@pytest.mark.parametrize("name, bad, exc, match", BAD)
def test_bad_input_raises_before_anything_is_written(device, name, bad, exc, match):
    case, args = _error_inputs(device)
    args[name] = bad(args)
    before = [t.clone() for t in (case.query, case.key, args["k_buffer"], args["v_buffer"]) if t.device.type != "meta"]
    with pytest.raises(exc, match=match):
        op(case.positions, case.query, case.key, 32, case.cos_sin_cache, True, args["value"], args["k_buffer"],
           args["v_buffer"], args["cache_loc"], args["k_scale"], args["v_scale"], 0)
    after = [t for t in (case.query, case.key, args["k_buffer"], args["v_buffer"]) if t.device.type != "meta"]
    for old, new in zip(before, after):
        assert torch.equal(bits(old), bits(new))


def test_fake_impl_checks_too():
    case, args = _error_inputs("cpu")
    bad_v = args["v_buffer"][:, :1]
    with torch._subclasses.FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (*case.args()[:2], case.key, case.cos_sin_cache)]
        k = mode.from_tensor(args["k_buffer"])
        with pytest.raises(ValueError, match=r"v_buffer: expected \[rows, heads \* head_size\], \[rows, heads, head_size\]"):
            op(fake[0], fake[1], fake[2], 32, fake[3], True, mode.from_tensor(args["value"]), k,
               mode.from_tensor(bad_v), mode.from_tensor(args["cache_loc"]))


def test_opcheck():
    case, args = _error_inputs("cpu")
    torch.library.opcheck(
        op, (case.positions, case.query, case.key, 32, case.cos_sin_cache, True, args["value"], args["k_buffer"],
             args["v_buffer"], args["cache_loc"], 0.5, None, 0),
    )


def _compiled_block(device, backend):
    torch._dynamo.reset()

    def block(positions, qkv, cache, k_buf, v_buf, loc):
        q, k, v = qkv.split([128, 64, 64], dim=-1)
        torch.ops.rope_compat.rotary_embedding_set_kv(positions, q, k, 32, cache, True, v, k_buf, v_buf, loc, 0.5, None)
        return (q * 2).sum(-1)

    compiled = torch.compile(block, fullgraph=True, backend=backend)
    case = make_case(tokens=(9,), heads=4, kv_heads=2, head_size=32, device=device)
    qkv = torch.randn(9, 256, device=device)
    k_buf = torch.randn(20, 2, 32, device=device).to(torch.float8_e4m3fn)
    v_buf = torch.randn(20, 2, 32, device=device).to(torch.float8_e4m3fn)
    loc = torch.randperm(20, device=device)[:9]
    inputs = [case.positions, qkv, case.cos_sin_cache, k_buf, v_buf, loc]
    eager_inputs = [t.clone() for t in inputs]
    out = compiled(*inputs)
    want = block(*eager_inputs)
    torch.testing.assert_close(out, want)
    for got, exp in zip(inputs, eager_inputs):
        assert torch.equal(bits(got), bits(exp))


def test_torch_compile_fullgraph_cpu():
    _compiled_block("cpu", "aot_eager")


@pytest.mark.gpu
def test_torch_compile_fullgraph_cuda():
    _compiled_block("cuda", "inductor")


@pytest.mark.gpu
def test_cuda_kernel_is_registered():
    assert extension.has_cuda_kernel(), extension.load_error()
    assert torch._C._dispatch_has_kernel_for_dispatch_key("rope_compat::rotary_embedding_set_kv", "CUDA")


@pytest.mark.gpu
@pytest.mark.parametrize("buffer_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_cuda_graph_capture(buffer_dtype):
    tokens, rows = 33, 100
    case = make_case(tokens=(tokens,), heads=8, kv_heads=2, head_size=128, dtype=torch.bfloat16, device="cuda")
    value = torch.randn(tokens, 256, dtype=torch.bfloat16, device="cuda")
    k_buf = torch.randn(rows, 2, 128, device="cuda").to(buffer_dtype)
    v_buf = torch.randn(rows, 2, 128, device="cuda").to(buffer_dtype)
    loc = torch.randperm(rows, device="cuda")[:tokens]
    q0, k0, kb0, vb0 = case.query.clone(), case.key.clone(), k_buf.clone(), v_buf.clone()
    args = lambda: (case.positions, case.query, case.key, 128, case.cos_sin_cache, True, value, k_buf, v_buf, loc,
                    0.5, 0.25)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        op(*args())  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(*args())
    # Replay on fresh inputs written into the captured tensors.
    for t, src in ((case.query, q0), (case.key, k0), (k_buf, kb0), (v_buf, vb0)):
        t.copy_(src)
    new_loc = torch.randperm(rows, device="cuda")[:tokens]
    loc.copy_(new_loc)
    graph.replay()
    q_e, k_e, kb_e, vb_e = q0.clone(), k0.clone(), kb0.clone(), vb0.clone()
    op(case.positions, q_e, k_e, 128, case.cos_sin_cache, True, value, kb_e, vb_e, new_loc, 0.5, 0.25)
    for got, exp in ((case.query, q_e), (case.key, k_e), (k_buf, kb_e), (v_buf, vb_e)):
        assert torch.equal(bits(got), bits(exp))


@pytest.mark.gpu
@pytest.mark.parametrize("buffer_dtype", [torch.bfloat16, torch.float32, *FP8], ids=str)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("tokens, heads, kv_heads, head, rot_dim", [
    (1, 32, 8, 128, 128), (300, 64, 8, 128, 128), (2000, 8, 2, 128, 128), (77, 8, 2, 64, 32),
    (3000, 32, 8, 128, 128), (3000, 16, 4, 128, 64),
])
def test_cuda_large_calls(buffer_dtype, is_neox, tokens, heads, kv_heads, head, rot_dim):
    """Launch sizes of decode and prefill, checked like the small cases (stores exact, poison kept).
    The 3000-token calls are more threads than an H100 or H200 holds at once, so they take the
    kernel's other load order (q/k before the cache row)."""
    _check(_run("cuda", torch.bfloat16, buffer_dtype, is_neox=is_neox, heads=heads, kv_heads=kv_heads, head=head,
                rot_dim=rot_dim, tokens=tokens, k_scale=0.7, v_scale=1.3, buffer_layout="paged"))
