"""`RotaryEmbedding` and `MRotaryEmbedding`: vLLM's rotary modules on top of `rotary_embedding`.

Same constructor arguments, attributes and cache row counts as vLLM's classes (one class
here, the variant given by `rope_parameters`), and `forward(positions, query, key=None)`
rotates in place and returns `(query, key)`. One deliberate difference: the cache is kept
in float32 (`cache_dtype`), not in the model dtype, because the op reads any cache dtype and
computes in float32; a bf16 cache would round cos/sin to 8 bits first. Pass
`cache_dtype=dtype` for vLLM's rounding.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from ..api import mrope_rotary_embedding, rotary_embedding
from ..ops.autograd import needs_grad, rotary_embedding_functional_op
from ..ops.checks import check_bool, check_int, check_tensor
from . import frequencies as fq
from .mrope import mrope_cos_sin_rows
from .cache import (
    compute_cos_sin_cache,
    cos_sin_rows,
    longrope_default_mscale,
    normalize_rope_parameters,
    resolve_base,
)

# Types whose vLLM module is built for the *original* length and holds `length * factor` rows.
_ROWS_TIMES_FACTOR = ("linear", "yarn", "deepseek_yarn")


def check_module_args(
    head_size: Any, rotary_dim: Any, max_position_embeddings: Any, base: Any, is_neox_style: Any,
    dtype: Any, rope_parameters: Any, cache_dtype: Any,
) -> Tuple[int, int, int]:
    """TypeError/ValueError naming the bad constructor argument; the three sizes as ints."""
    head_size = check_int("head_size", head_size)
    rotary_dim = check_int("rotary_dim", rotary_dim)
    max_position_embeddings = check_int("max_position_embeddings", max_position_embeddings)
    if base is not None and (isinstance(base, bool) or not isinstance(base, (int, float))):
        raise TypeError(f"base: expected a float or None, got {type(base).__name__}")
    check_bool("is_neox_style", is_neox_style)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: expected a torch.dtype or None, got {type(dtype).__name__}")
    if not isinstance(cache_dtype, torch.dtype):
        raise TypeError(f"cache_dtype: expected a torch.dtype, got {type(cache_dtype).__name__}")
    if rope_parameters is not None and not isinstance(rope_parameters, Mapping):
        raise TypeError(f"rope_parameters: expected a dict or None, got {type(rope_parameters).__name__}")
    if head_size <= 0:
        raise ValueError(f"head_size: must be positive, got {head_size}")
    if rotary_dim > head_size:
        raise ValueError(f"rotary_dim: {rotary_dim} exceeds head_size={head_size}")
    if max_position_embeddings < 0:
        raise ValueError(f"max_position_embeddings: must be >= 0, got {max_position_embeddings}")
    return head_size, rotary_dim, max_position_embeddings


def _rotate(positions, query, key, head_size: int, cache: torch.Tensor, is_neox: bool):
    """In place and returned; out of place (differentiable) when autograd must record it."""
    if needs_grad(query, key, cache):
        return rotary_embedding_functional_op(positions, query, key, head_size, cache, is_neox)
    rotary_embedding(positions, query, key, head_size, cache, is_neox)
    return query, key


class RotaryEmbedding(nn.Module):
    """Rotary embedding of one RoPE variant, holding its cos/sin cache as a buffer.

    head_size: size of each attention head; rotary_dim: how many of its leading dims rotate.
    max_position_embeddings: as vLLM passes it: the original (pre-scaling) length for
    linear/yarn/deepseek_yarn, whose caches have `ceil(length * factor)` rows, and the cache
    length otherwise. LongRoPE holds vLLM's two-part cache (`original` short-factor rows,
    then `max_position_embeddings` long-factor rows) and reads the long part when
    `use_long_rope` (default: `max_position_embeddings > original_max_position_embeddings`).
    """

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        is_neox_style: bool,
        dtype: Optional[torch.dtype] = None,
        rope_parameters: Optional[Mapping[str, Any]] = None,
        *,
        cache_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        head_size, rotary_dim, max_position_embeddings = check_module_args(
            head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, rope_parameters,
            cache_dtype,
        )
        params = normalize_rope_parameters(rope_parameters)
        self.rope_type: str = params["rope_type"]
        self.head_size = head_size
        # Proportional RoPE rotates the whole head; its unrotated pairs are identity columns.
        self.rotary_dim = head_size if self.rope_type == "proportional" else rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = resolve_base(params, base)
        self.is_neox_style = is_neox_style
        self.dtype = dtype if dtype is not None else torch.get_default_dtype()
        self.use_long_rope = False
        self._row_offset = 0  # first cache row of position 0 (LongRoPE's long part)
        cache = self._build_cache(params, rotary_dim, cache_dtype)
        self.cos_sin_cache: torch.Tensor
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _build_cache(self, params: dict, rotary_dim: int, cache_dtype: torch.dtype) -> torch.Tensor:
        rows = self.max_position_embeddings
        if self.rope_type in _ROWS_TIMES_FACTOR:
            rows = math.ceil(rows * params["factor"])
        if self.rope_type == "proportional":
            inv_freq = fq.proportional_inv_freq(
                self.head_size, rotary_dim // 2, self.base, params.get("factor") or 1.0
            )
            return cos_sin_rows(inv_freq, rows, 1.0, cache_dtype)
        if self.rope_type == "longrope":
            return self._build_longrope_cache(params, cache_dtype)
        return compute_cos_sin_cache(self.rotary_dim, rows, params, base=self.base, dtype=cache_dtype)

    def _build_longrope_cache(self, params: dict, cache_dtype: torch.dtype) -> torch.Tensor:
        orig = params["original_max_position_embeddings"]
        default = longrope_default_mscale(
            self.max_position_embeddings, orig, params.get("factor"), params.get("attention_factor")
        )
        parts = []
        for factors, mscale, rows in (
            (params["short_factor"], params.get("short_mscale"), orig),
            (params["long_factor"], params.get("long_mscale"), self.max_position_embeddings),
        ):
            inv_freq = fq.longrope_inv_freq(self.rotary_dim, self.base, factors)
            parts.append(cos_sin_rows(inv_freq, rows, default if mscale is None else mscale, cache_dtype))
        self.original_max_position_embeddings = orig
        self.use_long_rope = self.max_position_embeddings > orig
        self._row_offset = orig
        return torch.cat(parts)

    def _position_rows(self, cache: torch.Tensor) -> torch.Tensor:
        """The rows of positions 0, 1, ...: a row view (the op reads it as a cache)."""
        return cache[self._row_offset :] if self.use_long_rope else cache

    def _cache_for(self, query: torch.Tensor) -> torch.Tensor:
        cache = self.cos_sin_cache
        if cache.device != query.device:
            cache = cache.to(query.device)
            if not torch.compiler.is_compiling():  # keep it there, as vLLM does
                self.cos_sin_cache = cache
        return self._position_rows(cache)

    def get_cos_sin(self, seqlen: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[seqlen, rotary_dim / 2]` of positions `0..seqlen-1`."""
        return self._position_rows(self.cos_sin_cache)[:seqlen].chunk(2, dim=-1)

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Rotate `query` and `key` in place (vLLM layouts) and return them.

        With grad mode on and a query or key that requires grad, return rotated copies instead
        (differentiable, the inputs untouched), as vLLM's `forward_native` does.
        """
        check_tensor("query", query)
        return _rotate(positions, query, key, self.head_size, self._cache_for(query), self.is_neox_style)

    def extra_repr(self) -> str:
        return (
            f"rope_type={self.rope_type}, head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
            f"max_position_embeddings={self.max_position_embeddings}, base={self.base}, "
            f"is_neox_style={self.is_neox_style}"
        )


class MRotaryEmbedding(RotaryEmbedding):
    """Multimodal RoPE (Qwen2-VL and later): 2-D positions are `[3, num_tokens]` t/h/w.

    As in vLLM, the cache has `max_position_embeddings * positions_factor` rows (video
    positions exceed the token count), times `factor` with YaRN, and `max_position_embeddings`
    is stored multiplied. 1-D positions rotate as plain RoPE. Query and key are flat
    `[num_tokens, heads * head_size]` or `[num_tokens, heads, head_size]`. 2-D positions go
    to `mrope_rotary_embedding` (one op, one CUDA launch, no per-call gather).
    """

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        is_neox_style: bool,
        dtype: Optional[torch.dtype] = None,
        rope_parameters: Optional[Mapping[str, Any]] = None,
        *,
        mrope_section: Sequence[int],
        mrope_interleaved: bool = False,
        positions_factor: int = 4,
        cache_dtype: torch.dtype = torch.float32,
    ) -> None:
        if sum(mrope_section) != rotary_dim // 2:
            raise ValueError(f"mrope_section: {list(mrope_section)} must sum to rotary_dim / 2 = {rotary_dim // 2}")
        rope_type = normalize_rope_parameters(rope_parameters)["rope_type"]
        if rope_type not in ("default", "yarn"):
            raise ValueError(f"MRoPE supports rope_type default or yarn, got {rope_type!r}")
        super().__init__(
            head_size, rotary_dim, max_position_embeddings * positions_factor, base, is_neox_style,
            dtype, rope_parameters, cache_dtype=cache_dtype,
        )
        self.mrope_section = list(mrope_section)
        self.mrope_interleaved = mrope_interleaved

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        check_tensor("positions", positions)
        check_tensor("query", query)
        if positions.dim() == 1:
            return super().forward(positions, query, key)
        cache = self._cache_for(query)
        if needs_grad(query, key, cache):
            # The differentiable path: each token's cos/sin row gathered, then the functional
            # rotation (its backward is the inverse rotation).
            rows = mrope_cos_sin_rows(positions, cache, self.mrope_section, self.mrope_interleaved)
            token = torch.arange(rows.shape[0], device=positions.device)
            return _rotate(token, query, key, self.head_size, rows, self.is_neox_style)
        mrope_rotary_embedding(
            positions, query, key, self.head_size, cache, self.is_neox_style,
            self.mrope_section, self.mrope_interleaved,
        )
        return query, key
