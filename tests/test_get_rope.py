"""get_rope, RotaryEmbedding and MRotaryEmbedding: caching, errors, rotation, MRoPE."""

import math

import pytest
import torch

from reference import rope_reference
from tolerances import assert_matches_reference

import rope_compat
from rope_compat import MRotaryEmbedding, RotaryEmbedding, get_rope


def ref_angles(positions, dim, base):
    """float64 `[*positions.shape, dim/2]` angles of unscaled RoPE."""
    freqs = torch.tensor([base ** (-(2.0 * i) / dim) for i in range(dim // 2)], dtype=torch.float64)
    return positions.double()[..., None] * freqs


def ref_cache(rows, dim, base):
    a = ref_angles(torch.arange(rows), dim, base)
    return torch.cat([a.cos(), a.sin()], -1)


# ---------------------------------------------------------------- get_rope arguments


def test_get_rope_caches_modules_per_argument_set():
    params = {"rope_type": "longrope", "short_factor": [1.0] * 16, "long_factor": [2.0] * 16,
              "original_max_position_embeddings": 64, "rope_theta": 1e4}
    a = get_rope(32, 256, True, params, torch.float16)
    # Lists are made hashable, so an equal dict with tuples hits the same entry.
    same = dict(params, short_factor=tuple(params["short_factor"]), long_factor=tuple(params["long_factor"]))
    assert get_rope(32, 256, True, same, torch.float16) is a
    assert get_rope(32, 256, True, dict(params), torch.bfloat16) is not a
    assert get_rope(32, 256, False, dict(params), torch.float16) is not a
    assert get_rope(32, 256, True, dict(params, long_factor=[3.0] * 16), torch.float16) is not a


def test_unknown_rope_type_lists_known_types():
    with pytest.raises(ValueError) as err:
        get_rope(64, 128, True, {"rope_type": "made_up", "rope_theta": 1e4})
    message = str(err.value)
    assert "made_up" in message
    for known in ("default", "linear", "dynamic", "yarn", "deepseek_yarn", "llama3", "longrope"):
        assert known in message


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rope_parameters={"rope_theta": 1e4}, dual_chunk_attention_config={"chunk_size": 8}), "dual chunk"),
        (dict(rope_parameters={"rope_theta": 1e4, "use_fope": True}), "use_fope"),
        (dict(rope_parameters={"rope_theta": 1e4}, base=5e5), "rope_theta"),
        (dict(rope_parameters={"partial_rotary_factor": 0.5}, partial_rotary_factor=0.25), "partial_rotary_factor"),
        (dict(rope_parameters={"partial_rotary_factor": 0.0}), "partial_rotary_factor"),
        (dict(rope_parameters={"partial_rotary_factor": 1.5}), "partial_rotary_factor"),
    ],
)
def test_get_rope_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_rope(64, 128, True, **kwargs)


@pytest.mark.parametrize(
    "params, kwargs, rotary_dim, base",
    [
        ({"rope_theta": 5e5, "partial_rotary_factor": 0.5}, {}, 32, 5e5),
        (None, {"base": 2e4, "partial_rotary_factor": 0.25}, 16, 2e4),  # older vLLM keywords
        ({"rope_theta": 1e4, "rope_dim": 24}, {}, 24, 1e4),
        ({"rope_theta": 1e4}, {"rotary_dim": 40}, 40, 1e4),
        (None, {}, 64, 10000.0),
    ],
)
def test_get_rope_reads_rotary_dim_and_base(params, kwargs, rotary_dim, base):
    rope = get_rope(64, 96, True, params, torch.float32, **kwargs)
    assert (rope.head_size, rope.rotary_dim, rope.base, rope.max_position_embeddings) == (64, rotary_dim, base, 96)
    torch.testing.assert_close(rope.cos_sin_cache.double(), ref_cache(96, rotary_dim, base), rtol=0, atol=6e-8)


@pytest.mark.parametrize(
    "params, rows",
    [
        ({"rope_type": "linear", "factor": 2.5}, 320),  # max_position * factor
        ({"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 50}, 150),  # original * factor
        ({"rope_type": "deepseek_yarn", "factor": 2.0, "original_max_position_embeddings": 64}, 128),
        ({"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [4.0] * 8,
          "original_max_position_embeddings": 32}, 32 + 128),  # short rows, then long rows
        ({"rope_type": "dynamic", "alpha": 4.0}, 128),
        ({"rope_theta": 1e4, "mrope_section": [2, 3, 3]}, 128 * 4),  # vLLM's positions_factor
        ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16, "mrope_section": [2, 3, 3]},
         16 * 4 * 2),
    ],
)
def test_cache_rows_follow_vllm(params, rows):
    rope = get_rope(16, 128, True, params, torch.float32)
    assert rope.cos_sin_cache.shape == (rows, rope.rotary_dim)
    assert rope.cos_sin_cache.dtype == torch.float32 and rope.dtype == torch.float32


def test_cache_dtype_and_model_dtype_are_separate():
    rope = get_rope(32, 64, True, {"rope_theta": 1e4}, torch.bfloat16)
    assert rope.dtype == torch.bfloat16 and rope.cos_sin_cache.dtype == torch.float32
    rounded = get_rope(32, 64, True, {"rope_theta": 1e4}, torch.bfloat16, cache_dtype=torch.bfloat16)
    assert torch.equal(rounded.cos_sin_cache, rope.cos_sin_cache.to(torch.bfloat16))


# ---------------------------------------------------------------- forward


FORWARD_CASES = [
    ("default", 64, {"rope_theta": 1e4}),
    ("partial", 128, {"rope_theta": 5e5, "partial_rotary_factor": 0.25}),
    ("yarn", 64, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}),
    ("llama3", 64, {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    ("proportional", 64, {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("case", FORWARD_CASES, ids=[c[0] for c in FORWARD_CASES])
def test_forward_rotates_in_place_like_the_reference(case, is_neox, dtype, device):
    _, head_size, params = case
    rope = get_rope(head_size, 512, is_neox, params, dtype)
    rows = rope.cos_sin_cache.shape[0]
    positions = torch.randint(0, rows, (23,), device=device)
    q = torch.randn(23, 4 * head_size, dtype=dtype, device=device)
    k = torch.randn(23, 2, head_size, dtype=dtype, device=device)
    q_ref, k_ref = rope_reference(positions, q, k, head_size, rope.cos_sin_cache, is_neox)
    q_out, k_out = rope(positions, q, k)
    assert q_out is q and k_out is k
    assert_matches_reference(q, q_ref, "query")
    assert_matches_reference(k, k_ref, "key")


def test_forward_default_against_independent_angles():
    head_size, rot = 96, 48
    rope = get_rope(head_size, 300, True, {"rope_theta": 1e4, "partial_rotary_factor": 0.5}, torch.float32)
    positions = torch.randint(0, 300, (2, 9))  # [batch, seq] positions
    q = torch.randn(2, 9, 3 * head_size)
    q0 = q.clone()
    rope(positions, q)  # key=None
    a = ref_angles(positions, rot, 1e4)[..., None, :]  # [2, 9, 1 (heads), rot/2]
    x = q0.double().unflatten(-1, (3, head_size))
    x1, x2 = x[..., : rot // 2], x[..., rot // 2 : rot]
    expected = torch.cat([x1 * a.cos() - x2 * a.sin(), x2 * a.cos() + x1 * a.sin(), x[..., rot:]], -1)
    assert_matches_reference(q, expected.flatten(-2), "query")


@pytest.mark.parametrize("use_long", [True, False])
def test_longrope_forward_reads_the_selected_half(use_long):
    orig, max_pos, head_size = 32, 256, 16
    g = torch.Generator().manual_seed(5)
    short = (1 + torch.rand(8, generator=g)).tolist()
    long = (1 + 20 * torch.rand(8, generator=g)).tolist()
    rope = RotaryEmbedding(head_size, head_size, max_pos, 1e4, True, torch.float32,
                           {"rope_type": "longrope", "short_factor": short, "long_factor": long,
                            "original_max_position_embeddings": orig})
    assert rope.use_long_rope
    rope.use_long_rope = use_long
    factors = torch.tensor(long if use_long else short, dtype=torch.float64)
    mscale = math.sqrt(1 + math.log(max_pos / orig) / math.log(orig))
    positions = torch.randint(0, max_pos if use_long else orig, (11,))
    freqs = torch.tensor([1e4 ** (-(2.0 * i) / head_size) for i in range(8)], dtype=torch.float64) / factors
    a = positions.double()[:, None] * freqs
    table = torch.zeros(max_pos, head_size, dtype=torch.float64)
    table[positions] = torch.cat([a.cos(), a.sin()], -1) * mscale
    q, k = torch.randn(11, 2 * head_size), torch.randn(11, head_size)
    q_ref, k_ref = rope_reference(positions, q, k, head_size, table, True)
    rope(positions, q, k)
    assert_matches_reference(q, q_ref, "query")
    assert_matches_reference(k, k_ref, "key")
    torch.testing.assert_close(rope.get_cos_sin(max_pos if use_long else orig)[0][positions].double(),
                               a.cos() * mscale, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- MRoPE


def ref_sections(section, interleaved):
    """Which of t/h/w drives each frequency, written out as the Qwen-VL model code describes."""
    if not interleaved:
        return [0] * section[0] + [1] * section[1] + [2] * section[2]
    out = []
    for c in range(sum(section)):
        if c % 3 == 1 and c < 3 * section[1]:
            out.append(1)
        elif c % 3 == 2 and c < 3 * section[2]:
            out.append(2)
        else:
            out.append(0)
    return out


def ref_mrope(positions, x, head_size, rot, base, section, interleaved, is_neox, mscale=1.0, freqs=None):
    """Rotate each token with per-frequency angles `positions[s(c), t] * f_c`, in float64."""
    if freqs is None:
        freqs = [base ** (-(2.0 * c) / rot) for c in range(rot // 2)]
    s = ref_sections(section, interleaved)
    y = x.double().clone().unflatten(-1, (-1, head_size))
    for t in range(positions.shape[1]):
        for c in range(rot // 2):
            angle = float(positions[s[c], t]) * freqs[c]
            i, j = (c, c + rot // 2) if is_neox else (2 * c, 2 * c + 1)
            a, b = y[t, :, i].clone(), y[t, :, j].clone()
            cos, sin = math.cos(angle) * mscale, math.sin(angle) * mscale
            y[t, :, i] = a * cos - b * sin
            y[t, :, j] = b * cos + a * sin
    return y.reshape(x.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize(
    "section, interleaved", [([16, 24, 24], False), ([24, 20, 20], True), ([32, 20, 12], True)]
)
def test_mrope_matches_independent_reference(section, interleaved, is_neox, dtype, device):
    head_size, rot, base, tokens = 160, 128, 1e6, 13
    rope = get_rope(head_size, 256, is_neox,
                    {"rope_theta": base, "partial_rotary_factor": 0.8, "mrope_section": section,
                     "mrope_interleaved": interleaved}, dtype)
    assert isinstance(rope, MRotaryEmbedding) and rope.rotary_dim == rot
    positions = torch.randint(0, 256 * 4, (3, tokens), device=device)
    q = torch.randn(tokens, 4 * head_size, dtype=dtype, device=device)
    k = torch.randn(tokens, 2 * head_size, dtype=dtype, device=device)
    q_ref = ref_mrope(positions.cpu(), q.cpu(), head_size, rot, base, section, interleaved, is_neox)
    k_ref = ref_mrope(positions.cpu(), k.cpu(), head_size, rot, base, section, interleaved, is_neox)
    rope(positions, q, k)
    assert_matches_reference(q, q_ref, "query")
    assert_matches_reference(k, k_ref, "key")


def test_mrope_with_yarn_and_text_positions():
    head_size, section = 64, [8, 12, 12]
    params = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 64,
              "mrope_section": section}
    rope = get_rope(head_size, 256, True, params)
    yarn_rows = rope_compat.compute_cos_sin_cache(
        head_size, rope.cos_sin_cache.shape[0], params, dtype=torch.float64
    )  # YaRN itself is checked in test_cache_builders.py
    assert torch.equal(rope.cos_sin_cache, yarn_rows.float())
    positions = torch.randint(0, 64 * 4, (3, 7))
    q = torch.randn(7, 2 * head_size)
    q_ref = ref_mrope(positions, q, head_size, head_size, 1e4, section, False, True,
                      mscale=yarn_rows[0, 0].item(),  # the YaRN temperature is cos(0) * mscale
                      freqs=torch.atan2(yarn_rows[1, 32:], yarn_rows[1, :32]).tolist())
    rope(positions, q)
    assert_matches_reference(q, q_ref, "query")
    # 1-D positions rotate as plain (text-only) RoPE.
    text = torch.randint(0, 256, (5,))
    q = torch.randn(5, head_size)
    q_ref, _ = rope_reference(text, q, None, head_size, rope.cos_sin_cache, True)
    rope(text, q)
    assert_matches_reference(q, q_ref, "query")


def test_mrope_rejects_bad_sections():
    with pytest.raises(ValueError, match="mrope_section"):
        get_rope(64, 32, True, {"rope_theta": 1e4, "mrope_section": [8, 8, 8]})
    with pytest.raises(ValueError, match="MRoPE"):
        MRotaryEmbedding(64, 64, 32, 1e4, True, rope_parameters={"rope_type": "linear", "factor": 2.0},
                         mrope_section=[8, 12, 12])
