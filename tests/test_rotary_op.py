"""rope_compat.rotary_embedding against the float64 reference, over everything the op accepts.

Every case also checks what must not change: the pass-through dims of each head and, for
slices of a fused qkv tensor, the v part and the padding, bit for bit.
"""

import itertools

import pytest
import torch

import rope_compat
from cases import LAYOUTS, Case, make_case, random_cache
from reference import rope_reference
from tolerances import TOLERANCES, assert_matches_reference

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
POSITION_SHAPES = [((5,), torch.int64), ((5,), torch.int32), ((2, 3), torch.int32), ((2, 3), torch.int64)]
HEADS = {"mha": (4, 4), "gqa": (8, 2), "mqa": (8, 1)}
# (rot_dim, rope_dim_offset) for head_size 64: full, partial from 0, partial from inside.
ROTATIONS = {"full": (None, 0), "partial": (32, 0), "offset": (16, 40)}


def _root(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage `t` views (the fused qkv tensor for fused layouts)."""
    return t if t._base is None else t._base


def _heads_view(x: torch.Tensor, case: Case) -> torch.Tensor:
    """`x` as [*tokens, heads, head_size]."""
    pd = case.positions.dim()
    return x if x.dim() == pd + 2 else x.unflatten(-1, (-1, case.head_size))


def _rotated_mask(case: Case, root: torch.Tensor) -> torch.Tensor:
    """True for the elements of `root` that the op may write: the rotated dims of q and k."""
    assert root.is_contiguous()
    mask = torch.zeros(root.shape, dtype=torch.bool, device=root.device)
    rot_dim = case.cos_sin_cache.shape[1]
    for x in (case.query, case.key):
        if x is not None and _root(x) is root:
            view = mask.as_strided(x.shape, x.stride(), x.storage_offset() - root.storage_offset())
            _heads_view(view, case)[..., case.rope_dim_offset : case.rope_dim_offset + rot_dim] = True
    return mask


def run_and_check(case: Case, call=rope_compat.rotary_embedding) -> None:
    """Run `call` on the case, compare with the reference, check that nothing else changed.

    "Nothing else" is every element of the tensors q and k view (the fused qkv tensor with
    its v part and padding, for fused layouts) outside the rotated dims, compared bit for bit.
    """
    expected_q, expected_k = rope_reference(*case.args())
    roots = list({id(_root(t)): _root(t) for t in (case.query, case.key) if t is not None}.values())
    before = [r.clone() for r in roots]

    call(*case.args())

    assert_matches_reference(case.query, expected_q, "query")
    if case.key is not None:
        assert_matches_reference(case.key, expected_k, "key")
    for root, old in zip(roots, before):
        kept = ~_rotated_mask(case, root)
        assert torch.equal(root[kept], old[kept]), "elements outside the rotated dims changed"


@pytest.mark.parametrize("pos_shape,pos_dtype", POSITION_SHAPES)
@pytest.mark.parametrize("rotation", ROTATIONS)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_heads_rotations(device, layout, is_neox, heads, rotation, pos_shape, pos_dtype):
    rot_dim, offset = ROTATIONS[rotation]
    case = make_case(
        tokens=pos_shape, heads=HEADS[heads][0], kv_heads=HEADS[heads][1], head_size=64,
        rot_dim=rot_dim, rope_dim_offset=offset, is_neox=is_neox, pos_dtype=pos_dtype,
        layout=layout, cache_rows=97, device=device,
    )
    run_and_check(case)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("rotation", ROTATIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_key_none(device, layout, rotation, is_neox):
    rot_dim, offset = ROTATIONS[rotation]
    case = make_case(
        tokens=(6,), rot_dim=rot_dim, rope_dim_offset=offset, is_neox=is_neox, layout=layout,
        with_key=False, cache_rows=50, device=device,
    )
    run_and_check(case)


@pytest.mark.parametrize("layout", ["flat", "fused_heads"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes(device, dtype, cache_dtype, is_neox, layout):
    case = make_case(
        tokens=(9,), rot_dim=32, rope_dim_offset=16, is_neox=is_neox, dtype=dtype,
        cache_dtype=cache_dtype, layout=layout, cache_rows=64, device=device,
    )
    run_and_check(case)


def _size_cases():
    for tokens, head_size, rot_dim in itertools.product((1, 3, 257), (64, 80, 96, 128, 256), (2, 16, 34, None)):
        rot = head_size if rot_dim is None else rot_dim
        for offset in sorted({0, head_size - rot, (head_size - rot) // 2 & ~1}):
            yield tokens, head_size, rot_dim, offset


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("tokens,head_size,rot_dim,offset", list(_size_cases()))
def test_odd_sizes(device, tokens, head_size, rot_dim, offset, is_neox):
    case = make_case(
        tokens=(tokens,), heads=3, kv_heads=1, head_size=head_size, rot_dim=rot_dim,
        rope_dim_offset=offset, is_neox=is_neox, dtype=torch.bfloat16, layout="fused_flat",
        cache_rows=300, device=device,
    )
    run_and_check(case)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_inverse_matches_reference(device, layout, is_neox):
    case = make_case(
        tokens=(2, 4), rot_dim=32, rope_dim_offset=8, is_neox=is_neox, layout=layout,
        dtype=torch.float16, inverse=True, cache_rows=40, device=device,
    )
    run_and_check(case)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_inverse_undoes_forward(device, dtype, cache_dtype, is_neox):
    case = make_case(
        tokens=(33,), rot_dim=48, rope_dim_offset=8, is_neox=is_neox, dtype=dtype,
        cache_dtype=cache_dtype, layout="fused_heads", cache_rows=200, device=device,
    )
    q0, k0 = case.query.clone(), case.key.clone()
    rope_compat.rotary_embedding(*case.args())
    rope_compat.rotary_embedding(
        case.positions, case.query, case.key, case.head_size, case.cos_sin_cache, case.is_neox,
        case.rope_dim_offset, inverse=True,
    )
    # Each pass rounds once to the dtype (half an ulp of the pair's magnitude) and the rotation
    # preserves magnitudes; a rounded cache row has cos^2 + sin^2 = 1 only to about one ulp of
    # the cache dtype. So the round trip is within two ulps (of the coarser dtype) of the
    # largest value.
    eps = max(torch.finfo(dtype).eps, torch.finfo(cache_dtype).eps)
    for x, x0 in ((case.query, q0), (case.key, k0)):
        atol = 2 * eps * float(x0.abs().max())
        torch.testing.assert_close(x, x0, rtol=0, atol=atol)


def test_padded_head_stride(device):
    """Heads whose stride is not head_size (e.g. a slice of [T, H, head_size + pad])."""
    tokens, heads, kv_heads, head_size = 7, 4, 2, 64
    q = torch.randn(tokens, heads, head_size + 16, device=device)[..., :head_size]
    k = torch.randn(tokens, kv_heads, head_size + 8, device=device)[..., 8:]
    case = Case(
        torch.randint(0, 30, (tokens,), device=device), q, k, head_size,
        random_cache(30, 32, torch.float32, device), True, rope_dim_offset=16,
    )
    run_and_check(case)


@pytest.mark.parametrize("pos_shape", [(0,), (0, 4), (3, 0)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_tokens_is_a_noop(device, layout, pos_shape):
    case = make_case(tokens=pos_shape, layout=layout, cache_rows=10, device=device)
    root_before = _root(case.query).clone()
    rope_compat.rotary_embedding(*case.args())
    assert torch.equal(_root(case.query), root_before)


def test_positions_at_cache_edges(device):
    """Row 0 and the last row of the cache are both valid."""
    case = make_case(tokens=(4,), cache_rows=16, device=device)
    case.positions = torch.tensor([0, 15, 15, 0], device=device)
    run_and_check(case)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_float32_cache_means_one_rounding(device, dtype, is_neox):
    """bf16/f16 q and k with a float32 cache are rotated in float32 and rounded once, so almost
    every element equals the float64 result rounded to their dtype (measured: under 0.02% differ).
    The dtype tolerance alone cannot see a cache rounded to q's dtype first: then about 28%
    differ, while the error stays near the tolerance."""
    case = make_case(tokens=(257,), heads=8, kv_heads=2, head_size=128, dtype=dtype, is_neox=is_neox,
                     device=device)
    want_q, want_k = rope_reference(*case.args())
    rope_compat.rotary_embedding(*case.args())
    for name, got, want in (("query", case.query, want_q), ("key", case.key, want_k)):
        differ = (got.cpu() != want.to(dtype).cpu()).float().mean().item()
        assert differ < 0.01, f"{name}: {differ:.2%} of elements differ from the once-rounded result"


# The Torch implementation works through tokens in blocks, three ways: a [T] run cut into
# blocks, whole sequences of a [B, S] batch per block, and one long sequence cut into blocks.
@pytest.mark.parametrize("tokens", [(2100,), (300, 2), (3, 700)], ids=["T", "many_short_seqs", "long_seqs"])
def test_many_tokens_in_blocks(device, tokens):
    """Enough tokens that the Torch implementation works through several blocks."""
    case = make_case(
        tokens=tokens, heads=16, kv_heads=4, head_size=128, dtype=torch.bfloat16,
        layout="fused_flat", cache_rows=2048, device=device,
    )
    run_and_check(case)


# Model shapes at decode sizes: (heads, kv_heads, head_size, rot_dim, is_neox). Together with
# the token counts they cross the range in which the CUDA kernel halves its vector width (2048
# to 4608 threads at 16-byte vectors) from both sides.
DECODE_SHAPES = {
    "32/8x128": (32, 8, 128, 128, True),
    "64/8x128": (64, 8, 128, 128, True),
    "32/32x128-rot64": (32, 32, 128, 64, True),
    "16/16x256-rot64-gptj": (16, 16, 256, 64, False),
}


@pytest.mark.parametrize("tokens", [1, 4, 8, 12, 16, 24, 32])
@pytest.mark.parametrize("shape", DECODE_SHAPES)
def test_decode_sizes(device, shape, tokens):
    heads, kv_heads, head_size, rot_dim, is_neox = DECODE_SHAPES[shape]
    case = make_case(
        tokens=(tokens,), heads=heads, kv_heads=kv_heads, head_size=head_size, rot_dim=rot_dim,
        is_neox=is_neox, dtype=torch.bfloat16, layout="fused_flat", device=device,
    )
    run_and_check(case)


def test_tolerances_cover_every_dtype():
    assert set(TOLERANCES) == set(DTYPES)
