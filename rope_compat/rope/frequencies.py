"""Inverse frequencies and magnitude scales of the RoPE variants, in float64.

Each function returns the `rotary_dim // 2` angular frequencies (radians per position) of
one variant, or the factor its cos/sin are multiplied by. The formulas follow Hugging Face
transformers' `modeling_rope_utils` and vLLM's `rotary_embedding` package; where the two
disagree the docstring says which one is followed. Everything is float64 on the CPU: the
cache builders round once, at the end, to the dtype asked for.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch

F64 = torch.float64


def default_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    """`base ** (-2i / rotary_dim)`: RoFormer (Su et al. 2021, arXiv:2104.09864)."""
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=F64) / rotary_dim))


def ntk_alpha_base(base: float, alpha: float, rotary_dim: int) -> float:
    """NTK-aware base with a fixed alpha, `base * alpha ** (d / (d - 2))`.

    The NTK-aware scaled RoPE of /u/bloc97 (reddit r/LocalLLaMA, 2023) with the stretch
    given directly, as Hunyuan models configure it (`dynamic` with `alpha`).
    """
    return base * alpha ** (rotary_dim / (rotary_dim - 2))


def dynamic_ntk_base(
    base: float, factor: float, seq_len: int, trained_len: int, rotary_dim: int
) -> float:
    """Dynamic NTK base for a sequence of `seq_len` tokens (/u/emozilla, 2023).

    `base * (factor * L / trained_len - (factor - 1)) ** (d / (d - 2))` with
    `L = max(seq_len, trained_len)`: like transformers, never below the trained base.
    vLLM uses `seq_len` unclamped, which differs only when `seq_len < trained_len`.
    """
    length = max(seq_len, trained_len)
    return base * (factor * length / trained_len - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))


def ntk_inv_freq(
    rotary_dim: int, base: float, factor: float, mixed_b: Optional[float] = None
) -> torch.Tensor:
    """Fixed or mixed NTK scaling (Su Jianlin, kexue.fm/archives/9706), as vLLM's `ntk`.

    Fixed: the frequencies of base `base * factor`, divided by `factor ** (2 / d)`.
    Mixed (`mixed_b` set): frequency i (1-based) divided by `exp(a * i ** b)` with
    `a = log(factor) / (d / 2) ** b`.
    """
    if mixed_b is None:
        return default_inv_freq(rotary_dim, base * factor) / factor ** (2.0 / rotary_dim)
    a = math.log(factor) / (rotary_dim / 2) ** mixed_b
    i = torch.arange(1, rotary_dim // 2 + 1, dtype=F64)
    return default_inv_freq(rotary_dim, base) / torch.exp(a * i**mixed_b)


def llama3_inv_freq(
    rotary_dim: int,
    base: float,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> torch.Tensor:
    """Llama 3.1's frequency-dependent scaling (Meta, "The Llama 3 Herd of Models", 2024).

    Wavelengths shorter than `orig / high_freq_factor` keep their frequency, those longer
    than `orig / low_freq_factor` are divided by `factor`, and the band between blends the
    two linearly in `orig / wavelength`.
    """
    inv_freq = default_inv_freq(rotary_dim, base)
    orig = original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    if high_freq_factor != low_freq_factor:
        smooth = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    else:  # the blended band is empty; avoid 0/0 (vLLM does the same)
        smooth = torch.zeros_like(inv_freq)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    low = torch.where(wavelen > orig / low_freq_factor, inv_freq / factor, blended)
    return torch.where(wavelen < orig / high_freq_factor, inv_freq, low)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature, `0.1 * mscale * ln(scale) + 1` (Peng et al. 2023,
    arXiv:2309.00071, eq. 21, with DeepSeek-V2's `mscale` coefficient); 1 when `scale <= 1`."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(
    factor: float,
    mscale: Optional[float] = None,
    mscale_all_dim: Optional[float] = None,
    attention_factor: Optional[float] = None,
) -> float:
    """The cos/sin multiplier of `yarn` in transformers and vLLM.

    `attention_factor` if given; else the ratio `get_mscale(factor, mscale) /
    get_mscale(factor, mscale_all_dim)` when both are set and nonzero; else
    `get_mscale(factor)`.
    """
    if attention_factor is not None:
        return float(attention_factor)
    if mscale and mscale_all_dim:
        return yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    return yarn_get_mscale(factor)


def deepseek_yarn_attention_factor(factor: float, mscale: float = 1.0, mscale_all_dim: float = 0.0) -> float:
    """DeepSeek-V2/V3's cos/sin multiplier: always `get_mscale(factor, mscale) /
    get_mscale(factor, mscale_all_dim)` (so `mscale_all_dim = 0` divides by 1).

    DeepSeek additionally multiplies its softmax scale by `get_mscale(factor,
    mscale_all_dim) ** 2`; that belongs to the attention layer, not to this cache.
    """
    return yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)


def yarn_correction_range(
    beta_fast: float, beta_slow: float, rotary_dim: int, base: float,
    original_max_position_embeddings: int, truncate: bool = True,
) -> Tuple[float, float]:
    """The dims where YaRN blends interpolation and extrapolation (arXiv:2309.00071, sec. 3.2).

    Dim index whose wavelength makes `beta` rotations over the trained length:
    `d * ln(orig / (2 pi beta)) / (2 ln base)`, floored/ceiled when `truncate`,
    clamped to `[0, d - 1]`.
    """
    def dim_for(rotations: float) -> float:
        return (
            rotary_dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi))
        ) / (2 * math.log(base))

    low, high = dim_for(beta_fast), dim_for(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, rotary_dim - 1)


def yarn_inv_freq(
    rotary_dim: int,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32,
    beta_slow: float = 1,
    truncate: bool = True,
) -> torch.Tensor:
    """YaRN's "NTK-by-parts" frequencies (Peng et al. 2023, arXiv:2309.00071).

    High frequencies (dims below the correction range) are kept, low ones divided by
    `factor`, with a linear ramp over the range between.
    """
    inv_freq = default_inv_freq(rotary_dim, base)
    low, high = yarn_correction_range(
        beta_fast, beta_slow, rotary_dim, base, original_max_position_embeddings, truncate
    )
    if low == high:
        high += 0.001  # the ramp needs a nonzero width (same guard as the reference code)
    ramp = ((torch.arange(rotary_dim // 2, dtype=F64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate (divide by factor)
    return inv_freq / factor * (1 - keep) + inv_freq * keep


def longrope_inv_freq(rotary_dim: int, base: float, ext_factors: Sequence[float]) -> torch.Tensor:
    """LongRoPE: each frequency divided by its own searched factor (Ding et al. 2024,
    arXiv:2402.13753; Phi-3's `short_factor`/`long_factor`)."""
    factors = torch.tensor(list(ext_factors), dtype=F64)
    if factors.numel() != rotary_dim // 2:
        raise ValueError(
            f"longrope: expected {rotary_dim // 2} rescale factors (rotary_dim / 2), got {factors.numel()}"
        )
    return default_inv_freq(rotary_dim, base) / factors


def longrope_attention_factor(factor: float, original_max_position_embeddings: int) -> float:
    """LongRoPE's default cos/sin multiplier, `sqrt(1 + ln(factor) / ln(orig))`; 1 if factor <= 1."""
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_max_position_embeddings))


def proportional_inv_freq(
    head_size: int, rope_angles: int, base: float, factor: float = 1.0
) -> torch.Tensor:
    """Gemma 4's proportional RoPE: `rope_angles` frequencies with exponents over the whole
    `head_size`, zero frequency (identity rotation) for the remaining `head_size/2 - rope_angles`
    pairs, all divided by `factor` (transformers; vLLM ignores `factor`)."""
    rotated = 1.0 / (base ** (torch.arange(0, 2 * rope_angles, 2, dtype=F64) / head_size))
    zeros = torch.zeros(head_size // 2 - rope_angles, dtype=F64)
    return torch.cat([rotated, zeros]) / factor
