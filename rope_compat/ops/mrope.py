"""Multimodal RoPE (Qwen2-VL and later): checks and Torch implementation of
`mrope_rotary_embedding`.

Each token has three positions, `positions[:, t]` = (temporal, height, width), and rotated
pair i (i < rot_dim / 2) takes its cos/sin from the cache row of `positions[s(i), t]`, where
`s(i)` is the section of pair i:
- contiguous layout (Qwen2-VL, Qwen2.5-VL): sections `[s0, s1, s2]` cover pairs
  `[0, s0)`, `[s0, s0 + s1)`, `[s0 + s1, rot_dim / 2)`;
- interleaved layout (Qwen3-VL): pair i is height if `i % 3 == 1 and i < 3 * s1`, width if
  `i % 3 == 2 and i < 3 * s2`, temporal otherwise (vLLM's `apply_interleaved_rope`).
Everything else is the plain op (ops/torch_impl.py): the same pairs (NeoX or GPT-J),
`rope_dim_offset`, `inverse`, float32 math rounded once, q/k layouts and strides.

`positions` is `[3, num_tokens]`, int32 or int64, each row contiguous (its row stride is
free, so a slice `[:, :T]` of a larger buffer works as is). On the CPU a position outside
`[0, cache rows)` raises IndexError; on other devices (no host sync) a token with any of
its three positions outside the cache is left untouched.

`mrope_rotary_embedding_set_kv` is this rotation (no inverse) followed by the KV-cache store
of ops/kv_store.py, with its checks and rules; a token left unrotated is stored as it is.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from .checks import (
    POSITION_DTYPES, RotaryShape, check_mrope_set_kv_types, check_mrope_types, check_no_grad, check_positions_in_range,
    check_rotary_args,
)
from . import kv_store, torch_impl


def check_mrope_positions(positions: torch.Tensor) -> None:
    """The MRoPE position checks: int32/int64 `[3, num_tokens]`, each row contiguous."""
    if positions.dtype not in POSITION_DTYPES:
        raise TypeError(f"positions: expected dtype int32 or int64, got {positions.dtype}")
    shape = positions.shape
    if len(shape) != 2 or shape[0] != 3:
        raise ValueError(
            f"positions: expected shape [3, num_tokens] (temporal, height, width rows) for MRoPE, "
            f"got {tuple(shape)}"
        )
    if shape[1] > 1 and positions.stride(1) != 1:
        raise ValueError(
            f"positions: each row must be contiguous (stride 1 along tokens), got stride {positions.stride(1)}"
        )


def check_sections(mrope_section: Sequence[int], rot_dim: int) -> None:
    half = rot_dim // 2
    sections = list(mrope_section)
    if len(sections) != 3 or min(sections) < 0 or sum(sections) != half:
        raise ValueError(
            f"mrope_section: expected 3 non-negative sections summing to rot_dim / 2 = {half}, got {sections}"
        )


def check_mrope_args(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    mrope_section: Sequence[int],
    rope_dim_offset: int = 0,
) -> RotaryShape:
    """The MRoPE position checks, the rotary checks on one position row, then the sections."""
    check_mrope_positions(positions)
    # One row stands for the tokens: the q/k layout checks are the plain op's.
    rs = check_rotary_args(positions[0], query, key, head_size, cos_sin_cache, rope_dim_offset)
    check_no_grad(query, key)  # in place, so not differentiable (the C++ checks' order)
    check_sections(mrope_section, rs.rot_dim)
    return rs


def check_mrope_set_kv_args(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    mrope_section: Sequence[int],
    value: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    cache_loc: torch.Tensor,
    k_scale: Optional[float],
    v_scale: Optional[float],
    rope_dim_offset: int = 0,
) -> Tuple[RotaryShape, kv_store.KVStoreShape]:
    """check_mrope_args with the store's checks (ops/kv_store.py) between the rotary checks and
    the no-grad check, the order of the C++ entry. Reads no tensor data."""
    check_mrope_positions(positions)
    row = positions[0]
    rs = check_rotary_args(row, query, key, head_size, cos_sin_cache, rope_dim_offset)
    layouts = kv_store.check_store_args(row, key, head_size, rs, value, k_buffer, v_buffer, cache_loc, k_scale, v_scale)
    check_no_grad(query, key, ("k_buffer", k_buffer), ("v_buffer", v_buffer))
    check_sections(mrope_section, rs.rot_dim)
    return rs, layouts


def section_index(mrope_section: Sequence[int], half: int, interleaved: bool, device=None) -> torch.Tensor:
    """int64 `[half]`: which position row (0 temporal, 1 height, 2 width) drives each pair."""
    i = torch.arange(half, device=device)
    s0, s1, _ = mrope_section
    if not interleaved:
        return (i >= s0).long() + (i >= s0 + s1).long()
    height = (i % 3 == 1) & (i < 3 * s1)
    width = (i % 3 == 2) & (i < 3 * mrope_section[2])
    return height.long() + 2 * width.long()


def _mrope_cos_sin(positions, cos_sin_cache, mrope_section, interleaved, inverse, rot_dim):
    """float32 cos, sin and -sin per token and pair, each `[T, 1, rot_dim / 2]`."""
    half = rot_dim // 2
    n = cos_sin_cache.shape[0]
    pos = positions.long()
    if pos.is_cpu:
        check_positions_in_range(pos, n)
        valid = None
    else:  # no host sync: tokens with a position outside the cache get the identity
        valid = ((pos >= 0) & (pos < n)).all(0).unsqueeze(-1)
        pos = pos.clamp(0, max(n - 1, 0))
    rows = pos.index_select(0, section_index(mrope_section, half, interleaved, pos.device)).t()  # [T, half]
    cols = torch.arange(half, device=pos.device)
    if n == 0:  # only reachable with no valid token: everything is the identity
        cos = torch.ones(rows.shape, device=pos.device)
        sin = torch.zeros(rows.shape, device=pos.device)
    else:
        cos = cos_sin_cache[rows, cols].float()
        sin = cos_sin_cache[rows, cols + half].float()
    if valid is not None:
        cos = torch.where(valid, cos, torch.ones_like(cos))
        sin = torch.where(valid, sin, torch.zeros_like(sin))
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    neg_sin = -sin
    return (cos, neg_sin, sin) if inverse else (cos, sin, neg_sin)


def mrope_rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    mrope_section: Sequence[int],
    mrope_interleaved: bool = False,
    rope_dim_offset: int = 0,
    inverse: bool = False,
) -> None:
    """Rotate `query` and `key` in place with MRoPE (see the module doc)."""
    head_size, mrope_section, rope_dim_offset = check_mrope_types(
        positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, mrope_interleaved,
        rope_dim_offset, inverse,
    )
    shape = check_mrope_args(positions, query, key, head_size, cos_sin_cache, mrope_section, rope_dim_offset)
    tensors = tuple(x for x in (query, key) if x is not None and x.numel() > 0)
    if not tensors:
        return
    with torch.no_grad():  # rotates in place, unrecorded, as the plain op does
        cos, sin, neg_sin = _mrope_cos_sin(
            positions, cos_sin_cache, mrope_section, mrope_interleaved, inverse, shape.rot_dim
        )
        args = (head_size, rope_dim_offset, shape.rot_dim)
        heads = sum(x.numel() for x in tensors) // (shape.num_tokens * head_size)
        block = max(1, torch_impl._BLOCK_BYTES // (4 * shape.rot_dim * heads))
        if shape.num_tokens <= block or not positions.is_cpu:
            for x in tensors:
                torch_impl._rotate_(x, *args, cos, sin, neg_sin, is_neox)
            return
        for t in range(0, shape.num_tokens, block):
            idx = slice(t, t + block)
            for x in tensors:
                torch_impl._rotate_(x[idx], *args, cos[idx], sin[idx], neg_sin[idx], is_neox)


def mrope_rotary_embedding_set_kv(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    mrope_section: Sequence[int],
    value: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    cache_loc: torch.Tensor,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    mrope_interleaved: bool = False,
    rope_dim_offset: int = 0,
) -> None:
    """MRoPE on query and key in place, then token t's rotated key (every dim) and value stored
    at row `cache_loc[t]` of k_buffer / v_buffer, with the store rules of ops/kv_store.py."""
    head_size, mrope_section, rope_dim_offset = check_mrope_set_kv_types(
        positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, value, k_buffer, v_buffer,
        cache_loc, k_scale, v_scale, mrope_interleaved, rope_dim_offset,
    )
    _, layouts = check_mrope_set_kv_args(
        positions, query, key, head_size, cos_sin_cache, mrope_section, value, k_buffer, v_buffer,
        cache_loc, k_scale, v_scale, rope_dim_offset,
    )
    if positions.shape[1] == 0 or key.numel() == 0:
        return
    # The rotation first: on the CPU it raises for positions outside the cache before it writes
    # anything, so nothing is stored either; elsewhere such a token's key is stored unrotated.
    mrope_rotary_embedding(
        positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, mrope_interleaved,
        rope_dim_offset,
    )
    kv_store.store_key_value(key, value, k_buffer, v_buffer, layouts, cache_loc, k_scale, v_scale, head_size)
