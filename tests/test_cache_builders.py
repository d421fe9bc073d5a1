"""Cos/sin caches of every RoPE variant against independent float64 formulas and vLLM.

The reference formulas below are written from the papers' and model cards' descriptions,
one frequency at a time with Python's `math` module and numpy, without calling any
rope_compat helper. vLLM's own modules are compared when its Python layer imports (it
needs packages beyond vllm itself; otherwise those tests skip).
"""

import math
import types

import numpy as np
import pytest
import torch

import rope_compat
from rope_compat import compute_cos_sin_cache

# ---------------------------------------------------------------- independent references


def ref_base_freqs(dim, base, denominator=None):
    denominator = denominator or dim
    return np.array([base ** (-(2.0 * i) / denominator) for i in range(dim // 2)])


def ref_table(freqs, rows, scale=1.0):
    angles = np.arange(rows, dtype=np.float64)[:, None] * freqs[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1) * scale


def ref_temperature(scale, coef=1.0):
    return 1.0 if scale <= 1 else 1.0 + 0.1 * coef * math.log(scale)


def ref_yarn_freqs(dim, base, factor, orig, beta_fast=32, beta_slow=1, truncate=True):
    # Dim i has wavelength 2*pi*base**(2i/dim); it turns orig/wavelength times over the
    # trained length. Dims turning more than beta_fast times keep their frequency, fewer
    # than beta_slow are interpolated (divided by factor), a linear ramp in between.
    def boundary(turns):
        return dim * math.log(orig / (2 * math.pi * turns)) / (2 * math.log(base))

    lo, hi = boundary(beta_fast), boundary(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if hi == lo:
        hi += 0.001
    out = []
    for i, f in enumerate(ref_base_freqs(dim, base)):
        interp_weight = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        out.append(f * (1 - interp_weight) + f / factor * interp_weight)
    return np.array(out)


def ref_llama3_freqs(dim, base, factor, low, high, orig):
    out = []
    for f in ref_base_freqs(dim, base):
        wavelength = 2 * math.pi / f
        if wavelength < orig / high:
            out.append(f)
        elif wavelength > orig / low:
            out.append(f / factor)
        else:
            w = (orig / wavelength - low) / (high - low)
            out.append(w * f + (1 - w) * f / factor)
    return np.array(out)


def ref_dynamic_base(base, factor, length, trained, dim):
    length = max(length, trained)
    return base * (factor * length / trained - factor + 1) ** (dim / (dim - 2))


def _rand_factors(n, lo, hi, seed):
    g = np.random.default_rng(seed)
    return [float(x) for x in g.uniform(lo, hi, n)]


SHORT, LONG = _rand_factors(32, 1.0, 2.0, 1), _rand_factors(32, 1.0, 40.0, 2)

# (id, rotary_dim, rows, rope_parameters, reference table)
CASES = [
    ("default", 64, 1000, {"rope_theta": 10000.0}, lambda: ref_table(ref_base_freqs(64, 1e4), 1000)),
    ("default-none", 32, 300, None, lambda: ref_table(ref_base_freqs(32, 1e4), 300)),
    ("default-partial-24", 24, 500, {"rope_theta": 1e6}, lambda: ref_table(ref_base_freqs(24, 1e6), 500)),
    ("mrope-alias", 64, 400, {"type": "mrope", "rope_theta": 1e6, "mrope_section": [8, 12, 12]},
     lambda: ref_table(ref_base_freqs(64, 1e6), 400)),
    ("linear", 64, 1200, {"rope_type": "linear", "factor": 4.0},
     lambda: ref_table(ref_base_freqs(64, 1e4) / 4.0, 1200)),
    ("dynamic-trained", 64, 2048, {"rope_type": "dynamic", "factor": 2.0, "max_trained_positions": 512},
     lambda: ref_table(ref_base_freqs(64, ref_dynamic_base(1e4, 2.0, 2048, 512, 64)), 2048)),
    ("dynamic-hf-orig", 128, 1500, {"type": "dynamic", "factor": 3.0, "original_max_position_embeddings": 1000},
     lambda: ref_table(ref_base_freqs(128, ref_dynamic_base(1e4, 3.0, 1500, 1000, 128)), 1500)),
    ("dynamic-untrained", 64, 800, {"rope_type": "dynamic", "factor": 2.0},
     lambda: ref_table(ref_base_freqs(64, 1e4), 800)),
    ("dynamic-shorter-than-trained", 64, 300, {"rope_type": "dynamic", "factor": 8.0, "max_trained_positions": 4096},
     lambda: ref_table(ref_base_freqs(64, 1e4), 300)),
    ("ntk-alpha", 128, 1000, {"rope_type": "dynamic", "alpha": 1000.0},
     lambda: ref_table(ref_base_freqs(128, 1e4 * 1000.0 ** (128 / 126)), 1000)),
    ("ntk-fixed", 64, 700, {"rope_type": "ntk", "factor": 4.0},
     lambda: ref_table(ref_base_freqs(64, 4e4) * 4.0 ** (-2 / 64), 700)),
    ("ntk-mixed", 64, 700, {"rope_type": "ntk", "factor": 4.0, "mixed_b": 0.5},
     lambda: ref_table(ref_base_freqs(64, 1e4) * np.array(
         [math.exp(-math.log(4.0) * ((i + 1) / 32) ** 0.5) for i in range(32)]), 700)),
    ("llama3.1", 128, 1000, {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
     lambda: ref_table(ref_llama3_freqs(128, 5e5, 8.0, 1.0, 4.0, 8192), 1000)),
    ("llama3.2-small-orig", 64, 900, {"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 512},
     lambda: ref_table(ref_llama3_freqs(64, 5e5, 32.0, 1.0, 4.0, 512), 900)),
    ("yarn-qwen", 128, 1024, {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                              "original_max_position_embeddings": 256},
     lambda: ref_table(ref_yarn_freqs(128, 1e6, 4.0, 256), 1024, ref_temperature(4.0))),
    ("yarn-no-truncate", 64, 2048, {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                    "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                                    "beta_slow": 1.0, "truncate": False},
     lambda: ref_table(ref_yarn_freqs(64, 1.5e5, 32.0, 4096, truncate=False), 2048, ref_temperature(32.0))),
    ("yarn-mscale-ratio", 64, 1024, {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                                     "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2},
     lambda: ref_table(ref_yarn_freqs(64, 1e4, 40.0, 4096, 16, 2), 1024,
                       ref_temperature(40.0, 0.707) / ref_temperature(40.0, 1.0))),
    ("yarn-mscale-only", 64, 512, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                                   "mscale": 0.707, "beta_fast": None},
     lambda: ref_table(ref_yarn_freqs(64, 1e4, 4.0, 128), 512, ref_temperature(4.0))),
    ("yarn-attention-factor", 64, 512, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                                        "attention_factor": 1.25, "mscale": 2.0, "mscale_all_dim": 1.0},
     lambda: ref_table(ref_yarn_freqs(64, 1e4, 4.0, 128), 512, 1.25)),
    ("deepseek-v2", 64, 1024, {"rope_type": "deepseek_yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                               "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1},
     lambda: ref_table(ref_yarn_freqs(64, 1e4, 40.0, 4096), 1024, 1.0)),
    ("deepseek-mscale-no-all-dim", 64, 1024, {"rope_type": "deepseek_llama_scaling", "factor": 16.0,
                                              "original_max_position_embeddings": 256, "mscale": 0.707},
     lambda: ref_table(ref_yarn_freqs(64, 1e4, 16.0, 256), 1024, ref_temperature(16.0, 0.707))),
    ("longrope-long", 64, 2048, {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                                 "original_max_position_embeddings": 256},
     lambda: ref_table(ref_base_freqs(64, 1e4) / np.array(LONG), 2048,
                       math.sqrt(1 + math.log(2048 / 256) / math.log(256)))),
    ("longrope-short-su", 64, 256, {"type": "su", "short_factor": SHORT, "long_factor": LONG,
                                    "original_max_position_embeddings": 256},
     lambda: ref_table(ref_base_freqs(64, 1e4) / np.array(SHORT), 256, 1.0)),
    ("longrope-attention-factor", 64, 1024, {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                                             "original_max_position_embeddings": 256, "attention_factor": 1.1},
     lambda: ref_table(ref_base_freqs(64, 1e4) / np.array(LONG), 1024, 1.1)),
    ("longrope-mscale", 64, 1024, {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                                   "original_max_position_embeddings": 256, "long_mscale": 1.3,
                                   "short_mscale": 0.9},
     lambda: ref_table(ref_base_freqs(64, 1e4) / np.array(LONG), 1024, 1.3)),
    ("proportional-gemma4", 256, 600, {"rope_type": "proportional", "rope_theta": 1e6,
                                       "partial_rotary_factor": 0.25},
     lambda: ref_table(np.concatenate([ref_base_freqs(64, 1e6, denominator=256), np.zeros(96)]), 600)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cache_matches_float64_formula(case):
    _, rot_dim, rows, params, reference = case
    expected = torch.from_numpy(reference())
    got = compute_cos_sin_cache(rot_dim, rows, params, dtype=torch.float64)
    assert got.shape == (rows, rot_dim) and got.dtype == torch.float64
    # Both are float64; the angles reach ~2000 rad, where float64 keeps ~1e-12.
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cache_rounds_once_to_the_requested_dtype(dtype):
    params = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512}
    exact = compute_cos_sin_cache(64, 4096, params, dtype=torch.float64)
    got = compute_cos_sin_cache(64, 4096, params, dtype=dtype)
    assert got.dtype == dtype
    assert torch.equal(got, exact.to(dtype))


def test_cache_is_filled_beyond_one_chunk():
    # 70,000 rows span two fill chunks; rows on both sides of the seam must be right.
    rows = 70_000
    got = compute_cos_sin_cache(8, rows, {"rope_theta": 500.0}, dtype=torch.float64)
    expected = torch.from_numpy(ref_table(ref_base_freqs(8, 500.0), rows))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)


def test_base_argument_and_conflicts():
    a = compute_cos_sin_cache(32, 64, None, base=5e5, dtype=torch.float64)
    b = compute_cos_sin_cache(32, 64, {"rope_theta": 5e5}, base=5e5, dtype=torch.float64)
    torch.testing.assert_close(a, torch.from_numpy(ref_table(ref_base_freqs(32, 5e5), 64)), rtol=0, atol=1e-12)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="rope_theta"):
        compute_cos_sin_cache(32, 64, {"rope_theta": 1e4}, base=5e5)


@pytest.mark.parametrize(
    "params, match",
    [
        ({"rope_type": "nope-such"}, "unknown rope_type 'nope-such'.*yarn.*longrope"),
        ({"rope_type": "yarn", "factor": 2.0}, "original_max_position_embeddings"),
        ({"rope_type": "llama3", "factor": 8.0}, "low_freq_factor"),
        ({"rope_type": "linear", "type": "yarn", "factor": 2.0}, "conflicts"),
        ({"rope_type": "dynamic"}, "factor"),
        ({"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 3,
          "original_max_position_embeddings": 8}, "expected 16 rescale factors"),
    ],
)
def test_bad_parameters_raise_value_error(params, match):
    with pytest.raises(ValueError, match=match):
        compute_cos_sin_cache(32, 16, params)


def test_odd_rotary_dim_raises():
    with pytest.raises(ValueError, match="rotary_dim"):
        compute_cos_sin_cache(31, 16)


# ---------------------------------------------------------------- long positions


def _mp_row(position, freqs):
    import mpmath

    mpmath.mp.dps = 40
    return [float(mpmath.cos(position * mpmath.mpf(f))) for f in freqs] + [
        float(mpmath.sin(position * mpmath.mpf(f))) for f in freqs
    ]


HALF_ULP_BELOW_ONE = {torch.float32: 2.0**-25, torch.float16: 2.0**-12, torch.bfloat16: 2.0**-9}


@pytest.mark.parametrize("dtype", list(HALF_ULP_BELOW_ONE))
def test_million_positions_stay_within_dtype_rounding(dtype):
    """At positions up to 1e6, each entry is the exact value rounded once to `dtype`.

    Reference: 40-digit mpmath at sampled rows, with the (float64) frequencies of the
    table. cos/sin lie in [-1, 1], where rounding to nearest errs by at most half an ulp
    of [0.5, 1); the float64 angles add ~1e-10 at 1e6 rad.
    """
    rows = 1_000_001
    cache = compute_cos_sin_cache(8, rows, {"rope_theta": 10000.0}, dtype=dtype)
    freqs = ref_base_freqs(8, 1e4)
    sample = [0, 1, 4095, 65535, 65536, 123_457, 524_287, 999_983, 1_000_000]
    sample += list(np.random.default_rng(3).integers(0, rows, 40))
    expected = torch.tensor([_mp_row(int(p), freqs) for p in sample], dtype=torch.float64)
    err = (cache[sample].double() - expected).abs().max().item()
    assert err <= HALF_ULP_BELOW_ONE[dtype] + 1e-9, f"{dtype}: max error {err:.3e}"


# ---------------------------------------------------------------- vLLM's own modules


def _vllm_rotary():
    """vLLM's rotary package and a config context, or None when its Python layer cannot load."""
    try:
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.model_executor.layers import rotary_embedding
        from vllm.model_executor.layers.rotary_embedding import phi3_long_rope_scaled_rope
    except Exception:  # missing optional packages raise more than ImportError
        return None
    return rotary_embedding, phi3_long_rope_scaled_rope, VllmConfig, set_current_vllm_config


VLLM = _vllm_rotary()
needs_vllm = pytest.mark.skipif(VLLM is None, reason="vLLM's Python layer (get_rope) does not import here")

# (head_size, max_position, rope_parameters): vLLM's get_rope arguments.
VLLM_CASES = [
    (64, 2048, {"rope_theta": 10000.0}),
    (128, 2048, {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    (80, 1024, {"rope_theta": 10000.0, "rope_dim": 32}),
    (64, 1024, {"rope_theta": 10000.0, "rope_type": "linear", "factor": 2.0}),
    (64, 2048, {"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0}),
    (64, 2048, {"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0, "max_trained_positions": 512}),
    (128, 2048, {"rope_theta": 10000.0, "rope_type": "dynamic", "alpha": 1000.0}),
    (64, 2048, {"rope_theta": 10000.0, "rope_type": "ntk", "factor": 4.0}),
    (64, 2048, {"rope_theta": 10000.0, "rope_type": "ntk", "factor": 4.0, "mixed_b": 0.5}),
    (128, 2048, {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    (128, 2048, {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}),
    (64, 2048, {"rope_theta": 150000.0, "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256,
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}),
    (64, 2048, {"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                "mscale": 0.707, "mscale_all_dim": 1.0}),
    (64, 2048, {"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                "attention_factor": 1.3}),
    (64, 2048, {"rope_theta": 10000.0, "rope_type": "deepseek_yarn", "factor": 4.0,
                "original_max_position_embeddings": 256, "mscale": 0.707, "mscale_all_dim": 0.707}),
    (64, 2048, {"rope_theta": 10000.0, "rope_type": "deepseek_yarn", "factor": 4.0,
                "original_max_position_embeddings": 256, "mscale": 0.5}),
    (64, 2048, {"rope_theta": 10000.0, "rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                "original_max_position_embeddings": 256}),
    (256, 1024, {"rope_theta": 1e6, "rope_type": "proportional", "partial_rotary_factor": 0.25}),
    (128, 512, {"rope_theta": 1e6, "mrope_section": [16, 24, 24]}),
    (128, 512, {"rope_theta": 1e6, "mrope_section": [24, 20, 20], "mrope_interleaved": True}),
]


def _vllm_module(head_size, max_position, params, monkeypatch):
    rotary, phi3, VllmConfig, set_config = VLLM
    # LongRoPE reads the engine's max_model_len from the config; give it max_position.
    model_config = types.SimpleNamespace(max_model_len=max_position)
    monkeypatch.setattr(phi3, "get_current_vllm_config", lambda: types.SimpleNamespace(model_config=model_config))
    with set_config(VllmConfig()):
        return rotary.get_rope(head_size, max_position, True, dict(params), torch.float32)


@needs_vllm
@pytest.mark.parametrize("case", VLLM_CASES, ids=lambda c: str(c[2].get("rope_type", "default")))
def test_get_rope_cache_matches_vllm(case, monkeypatch):
    head_size, max_position, params = case
    theirs = _vllm_module(head_size, max_position, params, monkeypatch)
    ours = rope_compat.get_rope(head_size, max_position, True, dict(params), torch.float32)
    for name in ("head_size", "rotary_dim", "max_position_embeddings", "base", "is_neox_style"):
        if hasattr(theirs, name):  # vLLM's LongRoPE module has no is_neox_style
            assert getattr(ours, name) == getattr(theirs, name), name
    their_cache = getattr(theirs, "cos_sin_cache", None)
    if their_cache is None:  # vLLM's LongRoPE module names its short-then-long table differently
        their_cache = theirs.long_short_cos_sin_cache
        assert ours.use_long_rope == theirs.use_long_rope
    assert ours.cos_sin_cache.shape == their_cache.shape
    # vLLM computes the angle p * f in float32 (a few 2**-24 relative error), so entry
    # differences grow with the position p; ours is float64 rounded once.
    p = torch.arange(their_cache.shape[0], dtype=torch.float64)[:, None]
    if hasattr(theirs, "original_max_position_embeddings") and their_cache.shape[0] > max_position:
        p = torch.where(p >= theirs.original_max_position_embeddings, p - theirs.original_max_position_embeddings, p)
    diff = (ours.cos_sin_cache.double() - their_cache.double()).abs()
    bound = 1e-6 + 1.5e-7 * p
    assert bool((diff <= bound).all()), f"max excess {(diff - bound).max().item():.3e}"


# ---------------------------------------------------------------- transformers' own formulas


def _transformers_rope():
    try:
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except Exception:
        return None
    return LlamaConfig, ROPE_INIT_FUNCTIONS


HF = _transformers_rope()

# (head_dim, config.max_position_embeddings, rope_parameters, HF seq_len, our max_position).
# transformers' dynamic NTK takes the trained length from config.max_position_embeddings;
# here it goes into the dict as original_max_position_embeddings.
HF_CASES = [
    (64, 1024, {"rope_type": "linear", "factor": 2.0}, None, 2048),
    (64, 1024, {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 1024}, 3000, 3000),
    (64, 1024, {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 1024}, 500, 500),
    (128, 16384, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_theta": 5e5}, None, 2048),
    (128, 2048, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                 "rope_theta": 1e6}, None, 2048),
    (64, 2048, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256, "beta_fast": 32.0,
                "beta_slow": 1.0, "truncate": False, "rope_theta": 1.5e5}, None, 2048),
    (64, 8192, {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096, "mscale": 0.707,
                "mscale_all_dim": 1.0}, None, 2048),
    (64, 2048, {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                "original_max_position_embeddings": 256}, 2048, 2048),
    (64, 2048, {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                "original_max_position_embeddings": 256, "attention_factor": 1.2}, 100, 256),
    (256, 2048, {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}, None, 2048),
]


@pytest.mark.skipif(HF is None, reason="transformers is not installed")
@pytest.mark.parametrize("case", HF_CASES, ids=lambda c: c[2]["rope_type"])
def test_frequencies_and_scale_match_transformers(case):
    head_dim, max_pos, params, seq_len, rows = case
    LlamaConfig, init_functions = HF
    config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=max_pos, rope_parameters=dict(params, rope_theta=params.get("rope_theta", 1e4)))
    inv_freq, attention = init_functions[params["rope_type"]](config, "cpu", seq_len=seq_len)
    cache = compute_cos_sin_cache(head_dim, rows, params, dtype=torch.float64)
    half = head_dim // 2
    # Row 1 holds scale * (cos f, sin f); every f here is below pi, so atan2 recovers it.
    freqs = torch.atan2(cache[1, half:], cache[1, :half])
    scale = torch.hypot(cache[1, half:], cache[1, :half])
    # transformers computes the frequencies in float32.
    torch.testing.assert_close(freqs, inv_freq.double(), rtol=5e-7, atol=1e-30)
    torch.testing.assert_close(scale, torch.full_like(scale, attention), rtol=1e-12, atol=0)
