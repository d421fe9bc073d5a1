"""`get_rope`: vLLM's factory of rotary modules, reading Hugging Face RoPE parameters."""

from __future__ import annotations

from typing import Any, Dict, Hashable, Mapping, Optional

import torch

from ..ops.checks import check_bool, check_int
from .cache import normalize_rope_parameters, resolve_base
from .module import MRotaryEmbedding, RotaryEmbedding

_ROPE_MODULES: Dict[Hashable, RotaryEmbedding] = {}


def _hashable(value: Any) -> Hashable:
    """Dicts and lists (e.g. LongRoPE factor lists) as nested tuples, for the module cache."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def _rotary_dim(
    head_size: int,
    params: Mapping[str, Any],
    partial_rotary_factor: Optional[float],
    rotary_dim: Optional[int],
) -> int:
    """`rope_dim` (vLLM's key) or `rotary_dim`, else `int(head_size * partial_rotary_factor)`."""
    dim = params.get("rope_dim") or rotary_dim
    if dim:
        return int(dim)
    factor = params.get("partial_rotary_factor")
    if factor is not None and partial_rotary_factor is not None and factor != partial_rotary_factor:
        raise ValueError(
            f"partial_rotary_factor={partial_rotary_factor} conflicts with "
            f"rope_parameters['partial_rotary_factor']={factor}"
        )
    factor = factor if factor is not None else (1.0 if partial_rotary_factor is None else partial_rotary_factor)
    if not 0.0 < factor <= 1.0:
        raise ValueError(f"partial_rotary_factor: must be in (0, 1], got {factor}")
    return int(head_size * factor)


def get_rope(
    head_size: int,
    max_position: int,
    is_neox_style: bool = True,
    rope_parameters: Optional[Mapping[str, Any]] = None,
    dtype: Optional[torch.dtype] = None,
    dual_chunk_attention_config: Optional[Mapping[str, Any]] = None,
    mrope_positions_factor: int = 4,
    *,
    base: Optional[float] = None,
    partial_rotary_factor: Optional[float] = None,
    rotary_dim: Optional[int] = None,
    cache_dtype: torch.dtype = torch.float32,
) -> RotaryEmbedding:
    """The rotary module for a model config, as vLLM 0.32's `get_rope` builds it.

    Positional arguments follow vLLM 0.32. `rope_parameters` is the config's
    `rope_parameters` (or legacy `rope_scaling`) dict, including `rope_theta`,
    `partial_rotary_factor`, `rope_dim` and `mrope_section` when the config has them.
    For callers of older vLLM versions, `base`, `partial_rotary_factor` and `rotary_dim` can
    be given as keywords instead (a value given both ways must agree). Modules are cached
    per argument set, so layers share one cache. Unknown `rope_type` values raise
    ValueError listing the known ones; `dual_chunk_attention_config` and FoPE are not
    supported (ValueError).
    """
    check_int("head_size", head_size)
    check_int("max_position", max_position)
    check_bool("is_neox_style", is_neox_style)
    if rope_parameters is not None and not isinstance(rope_parameters, Mapping):
        raise TypeError(f"rope_parameters: expected a dict or None, got {type(rope_parameters).__name__}")
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    key = (
        head_size, max_position, is_neox_style, _hashable(rope_parameters), dtype,
        _hashable(dual_chunk_attention_config), mrope_positions_factor, base,
        partial_rotary_factor, rotary_dim, cache_dtype,
    )
    if key in _ROPE_MODULES:
        return _ROPE_MODULES[key]

    if dual_chunk_attention_config is not None:
        raise ValueError("get_rope: dual chunk attention RoPE is not supported by rope_compat")
    params = normalize_rope_parameters(rope_parameters)
    if params.get("use_fope"):
        raise ValueError("get_rope: Fourier position embedding (use_fope) is not supported by rope_compat")
    theta = resolve_base(params, base)
    rot_dim = _rotary_dim(head_size, params, partial_rotary_factor, rotary_dim)
    rope_type = params["rope_type"]
    # vLLM builds these for the pre-scaling length (their caches hold length * factor rows).
    length = max_position
    if rope_type in ("yarn", "deepseek_yarn"):
        length = params.get("original_max_position_embeddings")
        if length is None:  # the message RotaryEmbedding gives for the same parameters
            raise ValueError(f"rope_parameters: rope_type {rope_type!r} needs original_max_position_embeddings")

    common = (head_size, rot_dim, length, theta, is_neox_style, dtype, params)
    if params.get("mrope_section") and rope_type in ("default", "yarn"):
        module: RotaryEmbedding = MRotaryEmbedding(
            *common,
            mrope_section=params["mrope_section"],
            mrope_interleaved=bool(params.get("mrope_interleaved", False)),
            positions_factor=mrope_positions_factor,
            cache_dtype=cache_dtype,
        )
    else:
        module = RotaryEmbedding(*common, cache_dtype=cache_dtype)
    _ROPE_MODULES[key] = module
    return module
