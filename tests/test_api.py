"""The public names besides rotary_embedding: FlashInfer's, the multi-LoRA op, the helpers."""

import pytest
import torch

import rope_compat
from cases import LAYOUTS, make_case, random_cache
from reference import rope_reference
from tolerances import assert_matches_reference


def _heads(x: torch.Tensor) -> torch.Tensor:
    """[tokens, heads, 64] whatever the layout (the cases here have one token dim)."""
    return x.unflatten(-1, (-1, 64)) if x.dim() == 2 else x


@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no_key"])
@pytest.mark.parametrize("rot_dim", [None, 32], ids=["full", "partial"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_rope_with_cos_sin_cache_returns_new_tensors(device, layout, is_neox, rot_dim, with_key):
    case = make_case(
        tokens=(11,), rot_dim=rot_dim, is_neox=is_neox, dtype=torch.bfloat16, layout=layout,
        with_key=with_key, cache_rows=64, device=device,
    )
    q_in, k_in = case.query.clone(), None if case.key is None else case.key.clone()
    expected_q, expected_k = rope_reference(*case.args())

    q, k = rope_compat.apply_rope_with_cos_sin_cache(
        case.positions, case.query, case.key, case.head_size, case.cos_sin_cache, is_neox
    )

    assert torch.equal(case.query, q_in), "query was modified"
    assert q.shape == case.query.shape and q.dtype == case.query.dtype
    assert q.data_ptr() != case.query.data_ptr()
    # The whole result against the reference, and the pass-through dims bit for bit: a
    # result that is not fully written cannot pass.
    assert_matches_reference(q, expected_q, "query")
    if rot_dim is not None:
        assert torch.equal(_heads(q)[..., rot_dim:], _heads(q_in)[..., rot_dim:])
    if with_key:
        assert torch.equal(case.key, k_in), "key was modified"
        assert k.data_ptr() != case.key.data_ptr()
        assert_matches_reference(k, expected_k, "key")
    else:
        assert k is None


def test_apply_rope_with_cos_sin_cache_defaults_to_neox(device):
    case = make_case(tokens=(5,), cache_rows=32, device=device)
    q, k = rope_compat.apply_rope_with_cos_sin_cache(
        case.positions, case.query, case.key, case.head_size, case.cos_sin_cache
    )
    expected_q, expected_k = rope_reference(*case.args())  # case.is_neox is True
    assert_matches_reference(q, expected_q)
    assert_matches_reference(k, expected_k)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("layout", ["flat", "fused_heads"])
def test_apply_rope_with_cos_sin_cache_inplace(device, layout, is_neox):
    case = make_case(tokens=(2, 5), is_neox=is_neox, rot_dim=48, layout=layout, cache_rows=64, device=device)
    expected_q, expected_k = rope_reference(*case.args())
    rope_compat.apply_rope_with_cos_sin_cache_inplace(
        case.positions, case.query, case.key, case.head_size, case.cos_sin_cache, is_neox=is_neox
    )
    assert_matches_reference(case.query, expected_q)
    assert_matches_reference(case.key, expected_k)


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_rope_inplace_with_cache_is_rotary_embedding(device, layout, inverse):
    """The issue-530 name is the same function (one way to do it), with every argument."""
    assert rope_compat.apply_rope_inplace_with_cache is rope_compat.rotary_embedding
    case = make_case(
        tokens=(9,), rot_dim=32, rope_dim_offset=16, is_neox=False, dtype=torch.float16,
        layout=layout, inverse=inverse, cache_rows=64, device=device,
    )
    expected_q, expected_k = rope_reference(*case.args())
    rope_compat.apply_rope_inplace_with_cache(
        case.positions, case.query, case.key, case.head_size, case.cos_sin_cache, case.is_neox,
        case.rope_dim_offset, case.inverse,
    )
    assert_matches_reference(case.query, expected_q)
    assert_matches_reference(case.key, expected_k)


# ---------------------------------------------------------------- positions_from_offsets


def _positions_loop(indptr, offsets):
    out = []
    for i in range(len(offsets)):
        out += [int(offsets[i]) + j for j in range(int(indptr[i + 1]) - int(indptr[i]))]
    return out


def test_positions_from_offsets_example(device):
    indptr = torch.tensor([0, 1, 5, 10], device=device)
    offsets = torch.tensor([4, 6, 3], device=device)
    positions = rope_compat.positions_from_offsets(indptr, offsets)
    assert positions.tolist() == [4, 6, 7, 8, 9, 3, 4, 5, 6, 7]
    assert positions.dtype == torch.int64 and positions.device == indptr.device


@pytest.mark.parametrize("pass_num_tokens", [False, True])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("seed", range(6))
def test_positions_from_offsets_random(device, seed, index_dtype, pass_num_tokens):
    gen = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 9, (1,), generator=gen))
    lengths = torch.randint(0, 6, (batch,), generator=gen)
    lengths[torch.randint(0, batch, (1,), generator=gen)] = 0  # an empty request
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(index_dtype)
    offsets = torch.randint(0, 1000, (batch,), generator=gen, dtype=index_dtype)
    num_tokens = int(indptr[-1]) if pass_num_tokens else None
    positions = rope_compat.positions_from_offsets(indptr.to(device), offsets.to(device), num_tokens)
    assert positions.tolist() == _positions_loop(indptr, offsets)


def test_positions_from_offsets_all_empty(device):
    indptr = torch.zeros(4, dtype=torch.int64, device=device)
    offsets = torch.tensor([5, 6, 7], device=device)
    assert rope_compat.positions_from_offsets(indptr, offsets).numel() == 0
    assert rope_compat.positions_from_offsets(indptr, offsets, num_tokens=0).numel() == 0


def test_positions_from_offsets_feeds_rotary_embedding(device):
    """Ragged requests rotated in one call equal each request rotated on its own."""
    indptr = torch.tensor([0, 3, 3, 8], device=device)
    offsets = torch.tensor([10, 0, 41], device=device)
    positions = rope_compat.positions_from_offsets(indptr, offsets, num_tokens=8)
    case = make_case(tokens=(8,), cache_rows=64, device=device)
    q_parts = [case.query[int(a) : int(b)].clone() for a, b in zip(indptr[:-1], indptr[1:])]
    rope_compat.rotary_embedding(positions, case.query, None, case.head_size, case.cos_sin_cache, True)
    for i, q in enumerate(q_parts):
        pos = torch.arange(q.shape[0], device=device) + int(offsets[i])
        rope_compat.rotary_embedding(pos, q, None, case.head_size, case.cos_sin_cache, True)
        assert torch.equal(q, case.query[int(indptr[i]) : int(indptr[i + 1])])


@pytest.mark.parametrize(
    "indptr,offsets,exc",
    [
        ([[0, 1], [1, 2]], [0], ValueError),  # 2-D indptr
        ([], [], ValueError),  # no elements
        ([0, 1, 2], [0], ValueError),  # one offset for two requests
        ([0.0, 1.0], [0], TypeError),  # float indptr
        ([0, 2, 4], [4.7, 1.2], TypeError),  # float offsets (not truncated to 4 and 1)
    ],
)
def test_positions_from_offsets_rejects_bad_input(indptr, offsets, exc):
    with pytest.raises(exc, match="indptr|offsets"):
        rope_compat.positions_from_offsets(torch.tensor(indptr), torch.tensor(offsets))


def test_positions_from_offsets_rejects_offsets_on_another_device():
    with pytest.raises(ValueError, match="offsets: on meta, but indptr is on cpu"):
        rope_compat.positions_from_offsets(torch.tensor([0, 2, 4]), torch.tensor([4, 1], device="meta"))


# ---------------------------------------------------------------- batched_rotary_embedding


@pytest.mark.parametrize("pos_shape", [(12,), (3, 4)])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_batched_rotary_embedding(device, layout, is_neox, pos_shape):
    """Token t reads cache row offsets[t] + positions[t]: one cache per LoRA, stacked."""
    loras, rows_per_lora = 3, 20
    case = make_case(
        tokens=pos_shape, rot_dim=32, is_neox=is_neox, layout=layout, cache_rows=rows_per_lora,
        device=device,
    )
    cache = random_cache(loras * rows_per_lora, 32, torch.float32, device)
    offsets = (torch.randint(0, loras, pos_shape) * rows_per_lora).to(device)
    expected_q, expected_k = rope_reference(
        case.positions, case.query, case.key, case.head_size, cache, is_neox, cache_offsets=offsets
    )
    rope_compat.batched_rotary_embedding(
        case.positions, case.query, case.key, case.head_size, cache, is_neox, 32, offsets
    )
    assert_matches_reference(case.query, expected_q)
    assert_matches_reference(case.key, expected_k)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no_key"])
@pytest.mark.parametrize("off_dtype", [torch.int64, torch.int32], ids=["off64", "off32"])
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32], ids=["pos64", "pos32"])
def test_batched_index_dtypes_key_none_and_pass_through(device, pos_dtype, off_dtype, with_key, cache_dtype):
    """Every positions/offsets dtype pair reads row offsets[t] + positions[t]; with rot_dim 32
    of head_size 64, dims 32-63 of every head and v come back bit-identical."""
    loras, rows_per_lora, rot = 4, 25, 32
    case = make_case(tokens=(3, 5), rot_dim=rot, pos_dtype=pos_dtype, layout="fused_heads",
                     with_key=with_key, cache_rows=rows_per_lora, device=device)
    cache = random_cache(loras * rows_per_lora, rot, cache_dtype, device)
    offsets = (torch.randint(1, loras, (3, 5)) * rows_per_lora).to(device=device, dtype=off_dtype)
    expected_q, expected_k = rope_reference(
        case.positions, case.query, case.key, case.head_size, cache, True, cache_offsets=offsets
    )
    qkv = case.query._base  # [3, 5, q | k | v | padding]
    q_width, k_width = 4 * 64, 2 * 64  # make_case's default heads
    before = qkv.clone()
    rope_compat.batched_rotary_embedding(case.positions, case.query, case.key, case.head_size, cache,
                                         True, rot, offsets)
    assert_matches_reference(case.query, expected_q, "query")
    if with_key:
        assert_matches_reference(case.key, expected_k, "key")
    rotated = torch.zeros_like(qkv, dtype=torch.bool)
    rotated[..., : q_width + (k_width if with_key else 0)].unflatten(-1, (-1, 64))[..., :rot] = True
    assert torch.equal(qkv[~rotated], before[~rotated]), "elements outside the rotated dims changed"


def test_batched_rotary_embedding_rejects_rot_dim_mismatch(device):
    case = make_case(tokens=(4,), rot_dim=32, cache_rows=10, device=device)
    offsets = torch.zeros(4, dtype=torch.int64, device=device)
    before = case.query.clone()
    with pytest.raises(ValueError, match="rot_dim"):
        rope_compat.batched_rotary_embedding(
            case.positions, case.query, case.key, case.head_size, case.cos_sin_cache, True, 16, offsets
        )
    assert torch.equal(case.query, before)
