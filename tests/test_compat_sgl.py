"""sgl-kernel parity: apply_rope_with_cos_sin_cache_inplace with fused_set_kv_buffer_arg.

Expected buffers are built independently: a copy of the poisoned (random) buffer whose rows
`cache_loc[i]` are set, one token at a time, to the float64 reference key and to the value.
"""

import pytest
import torch

import rope_compat
from rope_compat import FusedSetKVBufferArg

from cases import make_case
from reference import rope_reference
from tolerances import assert_matches_reference

HEAD = 64


def _fused_case(device, dtype, layout, is_neox, rot_dim, buffer_layout, tokens=11, kv_heads=2):
    case = make_case(
        tokens=(tokens,), heads=4, kv_heads=kv_heads, head_size=HEAD, rot_dim=rot_dim,
        is_neox=is_neox, dtype=dtype, layout=layout, device=device,
    )
    rows = 3 * tokens
    shape = (rows, kv_heads * HEAD) if buffer_layout == "flat" else (rows, kv_heads, HEAD)
    value = torch.randn(tokens, kv_heads * HEAD, dtype=dtype, device=device)
    arg = FusedSetKVBufferArg(
        value=value if buffer_layout == "flat" else value.view(tokens, kv_heads, HEAD),
        k_buffer=torch.randn(shape, dtype=dtype, device=device),  # poison: must stay where unwritten
        v_buffer=torch.randn(shape, dtype=dtype, device=device),
        k_scale=None,
        v_scale=None,
        cache_loc=torch.randperm(rows, device=device)[:tokens],
    )
    return case, arg


def _expected_buffer(buffer: torch.Tensor, loc: torch.Tensor, rows_per_token: torch.Tensor) -> torch.Tensor:
    expected = buffer.double().cpu().reshape(buffer.shape[0], -1).clone()
    flat = rows_per_token.double().cpu().reshape(loc.numel(), -1)
    for i, row in enumerate(loc.tolist()):
        expected[row] = flat[i]
    return expected.reshape(buffer.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["flat", "fused_heads"])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot_dim, buffer_layout", [(HEAD, "flat"), (32, "heads")])
def test_fused_set_kv_buffer_matches_reference(device, dtype, layout, is_neox, rot_dim, buffer_layout):
    case, arg = _fused_case(device, dtype, layout, is_neox, rot_dim, buffer_layout)
    want_q, want_k = rope_reference(*case.args())
    k_buffer_before, v_buffer_before = arg.k_buffer.clone(), arg.v_buffer.clone()

    rope_compat.apply_rope_with_cos_sin_cache_inplace(
        case.positions, case.query, case.key, HEAD, case.cos_sin_cache, is_neox,
        fused_set_kv_buffer_arg=arg, enable_pdl=True,
    )

    assert_matches_reference(case.query, want_q)
    assert_matches_reference(case.key, want_k)
    assert_matches_reference(arg.k_buffer, _expected_buffer(k_buffer_before, arg.cache_loc, want_k))
    # The value is copied bit for bit (float64 holds every f32/f16/bf16 value exactly).
    assert torch.equal(arg.v_buffer.cpu(), _expected_buffer(v_buffer_before, arg.cache_loc, arg.value).to(dtype))


def test_accepts_sgl_kernel_style_objects_without_scales(device):
    """Any object with the fields works (SGLang's newer arg has no k_scale/v_scale)."""
    case, arg = _fused_case(device, torch.float32, "flat", True, HEAD, "flat")

    class ArgWithoutScales:
        value, k_buffer, v_buffer, cache_loc = arg.value, arg.k_buffer, arg.v_buffer, arg.cache_loc

    want_q, want_k = rope_reference(*case.args())
    k_before = arg.k_buffer.clone()
    rope_compat.apply_rope_with_cos_sin_cache_inplace(
        case.positions, case.query, case.key, HEAD, case.cos_sin_cache,
        fused_set_kv_buffer_arg=ArgWithoutScales(),
    )
    assert_matches_reference(arg.k_buffer, _expected_buffer(k_before, arg.cache_loc, want_k))


def _bad(arg: FusedSetKVBufferArg, what: str) -> FusedSetKVBufferArg:
    if what == "k_scale":
        arg.k_scale = -0.5
    elif what == "v_scale":
        arg.v_scale = 0.0
    elif what == "cache_loc_dtype":
        arg.cache_loc = arg.cache_loc.float()
    elif what == "cache_loc_length":
        arg.cache_loc = arg.cache_loc[:-1]
    elif what == "buffer_dtype":
        arg.k_buffer = arg.k_buffer.half()
    elif what == "buffer_heads":
        arg.v_buffer = arg.v_buffer[:, : HEAD]
    elif what == "buffer_width":
        arg.k_buffer = arg.k_buffer[:, : HEAD + 8]
    elif what == "value_rows":
        arg.value = arg.value[:-1]
    elif what == "value_dtype":
        arg.value = arg.value.double()
    elif what == "value_1d":
        arg.value = arg.value.reshape(-1)
    elif what == "value_device":
        arg.value = arg.value.to("meta")
    elif what == "cache_loc_device":
        arg.cache_loc = arg.cache_loc.to("meta")
    return arg


@pytest.mark.parametrize(
    "what, exc, match",
    [
        ("k_scale", ValueError, "k_scale: must be a positive"),
        ("v_scale", ValueError, "v_scale: must be a positive"),
        ("cache_loc_dtype", TypeError, "cache_loc: expected dtype int32 or int64"),
        ("cache_loc_length", ValueError, "cache_loc"),
        ("buffer_dtype", TypeError, "k_buffer"),
        ("buffer_heads", ValueError, "v_buffer"),
        ("buffer_width", ValueError, "k_buffer"),
        ("value_rows", ValueError, r"value: leading dims \(10,\) must match positions.shape \(11,\)"),
        ("value_dtype", TypeError, "value: dtype torch.float64"),
        ("value_1d", ValueError, "value: expected"),
        ("value_device", ValueError, "value: on device meta"),
        ("cache_loc_device", ValueError, "cache_loc: on device meta"),
    ],
)
def test_bad_buffer_arguments_raise_before_anything_is_written(what, exc, match):
    case, arg = _fused_case("cpu", torch.float32, "flat", True, HEAD, "flat")
    arg = _bad(arg, what)
    before = [t.clone() for t in (case.query, case.key, arg.k_buffer, arg.v_buffer)]
    with pytest.raises(exc, match=match):
        rope_compat.apply_rope_with_cos_sin_cache_inplace(
            case.positions, case.query, case.key, HEAD, case.cos_sin_cache,
            fused_set_kv_buffer_arg=arg,
        )
    for old, new in zip(before, (case.query, case.key, arg.k_buffer, arg.v_buffer)):
        assert torch.equal(old, new)


def test_key_is_required_with_a_buffer_arg():
    case, arg = _fused_case("cpu", torch.float32, "flat", True, HEAD, "flat")
    query_before = case.query.clone()
    with pytest.raises(ValueError, match="key"):
        rope_compat.apply_rope_with_cos_sin_cache_inplace(
            case.positions, case.query, None, HEAD, case.cos_sin_cache, fused_set_kv_buffer_arg=arg
        )
    assert torch.equal(case.query, query_before)
