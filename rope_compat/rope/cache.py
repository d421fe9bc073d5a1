"""`compute_cos_sin_cache`: the `[max_position, rot_dim]` cos/sin table of any RoPE variant.

The variant and its parameters come as a Hugging Face style `rope_parameters` (or the older
`rope_scaling`) dict: `rope_type` (or the legacy `type`) picks one frequency builder below,
whose keyword-only parameters are the dict keys it reads (same names as in model configs).
Every builder returns the inverse frequencies and the cos/sin multiplier (float64); the
table is then filled in float64, in row chunks so that a million-row table needs no
float64 copy of itself, and rounded once to the requested dtype.

Row `p` is `[cos(p * f_0) .. cos(p * f_{r/2-1}) | sin(p * f_0) .. sin(p * f_{r/2-1})]`
times the multiplier: the layout `rotary_embedding` reads.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch

from . import frequencies as fq

Frequencies = Tuple[torch.Tensor, float]  # (inverse frequencies [rot_dim / 2], cos/sin multiplier)

DEFAULT_BASE = 10000.0
_CHUNK_ROWS = 1 << 16

# Legacy or engine-specific names, as vLLM's config patching maps them.
ROPE_TYPE_ALIASES = {"su": "longrope", "mrope": "default", "deepseek_llama_scaling": "deepseek_yarn"}


def _default(rotary_dim: int, max_position: int, base: float) -> Frequencies:
    """Unscaled RoPE (RoFormer, arXiv:2104.09864)."""
    return fq.default_inv_freq(rotary_dim, base), 1.0


def _linear(rotary_dim: int, max_position: int, base: float, *, factor: float) -> Frequencies:
    """Linear position interpolation, positions divided by `factor` (kaiokendev 2023; Chen et
    al. 2023, arXiv:2306.15595)."""
    return fq.default_inv_freq(rotary_dim, base) / factor, 1.0


def _dynamic(
    rotary_dim: int,
    max_position: int,
    base: float,
    *,
    factor: float,
    max_trained_positions: Optional[int] = None,
    original_max_position_embeddings: Optional[int] = None,
) -> Frequencies:
    """Dynamic NTK (/u/emozilla 2023): the frequencies transformers uses once a sequence is
    `max_position` tokens long.

    The trained length is `max_trained_positions` (vLLM's key), else
    `original_max_position_embeddings`, else `max_position` itself, which leaves the base
    unchanged: exactly vLLM's `DynamicNTKScalingRotaryEmbedding` with and without the
    trained length. transformers recomputes the frequencies as a sequence grows; one table
    for all positions can only hold those of one length, and this is the longest.
    """
    trained = max_trained_positions or original_max_position_embeddings or max_position
    new_base = fq.dynamic_ntk_base(base, factor, max_position, trained, rotary_dim)
    return fq.default_inv_freq(rotary_dim, new_base), 1.0


def _ntk_alpha(rotary_dim: int, max_position: int, base: float, *, alpha: float) -> Frequencies:
    """NTK with a fixed alpha (Hunyuan's `dynamic` + `alpha`; vLLM's DynamicNTKAlpha)."""
    return fq.default_inv_freq(rotary_dim, fq.ntk_alpha_base(base, alpha, rotary_dim)), 1.0


def _ntk(
    rotary_dim: int, max_position: int, base: float, *, factor: float, mixed_b: Optional[float] = None
) -> Frequencies:
    """Fixed or mixed NTK (kexue.fm/archives/9706), vLLM's `ntk` type."""
    return fq.ntk_inv_freq(rotary_dim, base, factor, mixed_b), 1.0


def _llama3(
    rotary_dim: int,
    max_position: int,
    base: float,
    *,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> Frequencies:
    """Llama 3.1 scaling (Meta, arXiv:2407.21783)."""
    inv_freq = fq.llama3_inv_freq(
        rotary_dim, base, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings
    )
    return inv_freq, 1.0


def _yarn(
    rotary_dim: int,
    max_position: int,
    base: float,
    *,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32,
    beta_slow: float = 1,
    mscale: Optional[float] = None,
    mscale_all_dim: Optional[float] = None,
    attention_factor: Optional[float] = None,
    truncate: bool = True,
) -> Frequencies:
    """YaRN (Peng et al. 2023, arXiv:2309.00071), as transformers' and vLLM's `yarn`."""
    inv_freq = fq.yarn_inv_freq(
        rotary_dim, base, factor, original_max_position_embeddings, beta_fast, beta_slow, truncate
    )
    return inv_freq, fq.yarn_attention_factor(factor, mscale, mscale_all_dim, attention_factor)


def _deepseek_yarn(
    rotary_dim: int,
    max_position: int,
    base: float,
    *,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32,
    beta_slow: float = 1,
    mscale: float = 1.0,
    mscale_all_dim: float = 0.0,
) -> Frequencies:
    """YaRN as DeepSeek-V2/V3 apply it (vLLM's `deepseek_yarn`): always truncated, and the
    multiplier is always the `mscale / mscale_all_dim` ratio (see
    `frequencies.deepseek_yarn_attention_factor`)."""
    inv_freq = fq.yarn_inv_freq(
        rotary_dim, base, factor, original_max_position_embeddings, beta_fast, beta_slow, True
    )
    return inv_freq, fq.deepseek_yarn_attention_factor(factor, mscale, mscale_all_dim)


def _longrope(
    rotary_dim: int,
    max_position: int,
    base: float,
    *,
    short_factor: Sequence[float],
    long_factor: Sequence[float],
    original_max_position_embeddings: int,
    factor: Optional[float] = None,
    attention_factor: Optional[float] = None,
    short_mscale: Optional[float] = None,
    long_mscale: Optional[float] = None,
) -> Frequencies:
    """LongRoPE (arXiv:2402.13753; Phi-3): one table of `max_position` rows.

    Like transformers for a sequence of `max_position` tokens: `long_factor` if
    `max_position > original_max_position_embeddings`, else `short_factor`. The multiplier is
    `long_mscale`/`short_mscale` (vLLM's keys) if given, else `attention_factor`, else
    `sqrt(1 + ln(s) / ln(orig))` with `s = factor` or `max_position / orig`. transformers
    takes `s` from the model's `max_position_embeddings` even for short sequences: for a
    short table of such a model, pass that ratio as `factor`.
    (`RotaryEmbedding` builds vLLM's two-part short-then-long table instead.)
    """
    use_long = max_position > original_max_position_embeddings
    mscale = long_mscale if use_long else short_mscale
    if mscale is None:
        mscale = longrope_default_mscale(
            max_position, original_max_position_embeddings, factor, attention_factor
        )
    ext = long_factor if use_long else short_factor
    return fq.longrope_inv_freq(rotary_dim, base, ext), float(mscale)


def longrope_default_mscale(
    max_position: int,
    original_max_position_embeddings: int,
    factor: Optional[float] = None,
    attention_factor: Optional[float] = None,
) -> float:
    """LongRoPE's multiplier when no per-table mscale is given (transformers' rule)."""
    if attention_factor is not None:
        return float(attention_factor)
    scale = factor if factor is not None else max_position / original_max_position_embeddings
    return fq.longrope_attention_factor(scale, original_max_position_embeddings)


def _proportional(
    rotary_dim: int,
    max_position: int,
    base: float,
    *,
    partial_rotary_factor: float = 1.0,
    factor: float = 1.0,
) -> Frequencies:
    """Gemma 4's proportional RoPE. Here `rotary_dim` is the whole head size (the table is
    that wide; the unrotated pairs get cos 1, sin 0) and `partial_rotary_factor` sets how
    many pairs rotate."""
    rope_angles = int(partial_rotary_factor * rotary_dim // 2)
    return fq.proportional_inv_freq(rotary_dim, rope_angles, base, factor), 1.0


ROPE_BUILDERS: Dict[str, Callable[..., Frequencies]] = {
    "default": _default,
    "linear": _linear,
    "dynamic": _dynamic,
    "ntk": _ntk,
    "llama3": _llama3,
    "yarn": _yarn,
    "deepseek_yarn": _deepseek_yarn,
    "longrope": _longrope,
    "proportional": _proportional,
}
ROPE_TYPES = tuple(ROPE_BUILDERS) + tuple(ROPE_TYPE_ALIASES)


def normalize_rope_parameters(rope_parameters: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """A copy with `rope_type` set (from the legacy `type` key if needed) and aliases resolved.

    Raises ValueError for an unknown type, or for `type` and `rope_type` that disagree.
    """
    params = dict(rope_parameters or {})
    legacy = params.pop("type", None)
    rope_type = params.get("rope_type", legacy) or "default"
    if legacy is not None and rope_type != legacy and ROPE_TYPE_ALIASES.get(legacy) != rope_type:
        raise ValueError(f"rope_parameters: 'rope_type'={rope_type!r} conflicts with 'type'={legacy!r}")
    rope_type = ROPE_TYPE_ALIASES.get(rope_type, rope_type)
    if rope_type not in ROPE_BUILDERS:
        raise ValueError(
            f"rope_parameters: unknown rope_type {rope_type!r}; known types: {', '.join(ROPE_TYPES)}"
        )
    params["rope_type"] = rope_type
    return params


def resolve_base(rope_parameters: Mapping[str, Any], base: Optional[float]) -> float:
    """`rope_theta` from the dict, or `base`, or 10000; ValueError if the two disagree."""
    theta = rope_parameters.get("rope_theta")
    if theta is not None and base is not None and float(theta) != float(base):
        raise ValueError(f"base={base} conflicts with rope_parameters['rope_theta']={theta}")
    value = theta if theta is not None else base
    return float(DEFAULT_BASE if value is None else value)


def rope_frequencies(
    rotary_dim: int, max_position: int, rope_parameters: Mapping[str, Any], base: float
) -> Frequencies:
    """Inverse frequencies (float64) and cos/sin multiplier of a normalized parameter dict."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim: must be even and positive, got {rotary_dim}")
    rope_type = rope_parameters["rope_type"]
    builder = ROPE_BUILDERS[rope_type]
    if rope_type == "dynamic" and rope_parameters.get("alpha") is not None:
        builder = _ntk_alpha
    sig = inspect.signature(builder)
    keys = [n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY]
    # Configs write `null` for optional keys they leave at the default.
    kwargs = {k: rope_parameters[k] for k in keys if rope_parameters.get(k) is not None}
    missing = [k for k in keys if sig.parameters[k].default is inspect.Parameter.empty and k not in kwargs]
    if missing:
        raise ValueError(f"rope_parameters: rope_type {rope_type!r} needs {', '.join(missing)}")
    return builder(rotary_dim, max_position, base, **kwargs)


def cos_sin_rows(
    inv_freq: torch.Tensor,
    num_rows: int,
    scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
    device: Optional[torch.device | str] = None,
) -> torch.Tensor:
    """`[num_rows, 2 * len(inv_freq)]` rows `scale * [cos(p f) | sin(p f)]`, p = 0..num_rows-1,
    computed in float64 and rounded once to `dtype`."""
    inv_freq = inv_freq.to(torch.float64)
    half = inv_freq.numel()
    out = torch.empty(num_rows, 2 * half, dtype=dtype)
    for start in range(0, num_rows, _CHUNK_ROWS):
        stop = min(start + _CHUNK_ROWS, num_rows)
        angles = torch.outer(torch.arange(start, stop, dtype=torch.float64), inv_freq)
        out[start:stop, :half] = angles.cos().mul_(scale)
        out[start:stop, half:] = angles.sin_().mul_(scale)
    return out if device is None else out.to(device)


def compute_cos_sin_cache(
    rotary_dim: int,
    max_position: int,
    rope_parameters: Optional[Mapping[str, Any]] = None,
    *,
    base: Optional[float] = None,
    dtype: torch.dtype = torch.float32,
    device: Optional[torch.device | str] = None,
) -> torch.Tensor:
    """The `[max_position, rotary_dim]` cos/sin cache of a RoPE variant, for `rotary_embedding`.

    rope_parameters: a model config's `rope_parameters`/`rope_scaling` dict, e.g.
    `{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}`;
    None means unscaled RoPE. Types: default, linear, dynamic (with `factor`, or `alpha`),
    ntk, llama3, yarn, deepseek_yarn, longrope, proportional, and the aliases su, mrope,
    deepseek_llama_scaling. Keys a type does not use are ignored.
    base: the RoPE theta, if the dict has no `rope_theta` (default 10000).
    The table always has `max_position` rows (vLLM's modules choose other counts for some
    types; `RotaryEmbedding` reproduces those). Computed in float64, returned in `dtype`.
    """
    params = normalize_rope_parameters(rope_parameters)
    inv_freq, scale = rope_frequencies(rotary_dim, max_position, params, resolve_base(params, base))
    return cos_sin_rows(inv_freq, max_position, scale, dtype, device)
