"""Argument checks for the rotary ops: the one statement of what the op accepts.

The Torch implementation and the fake (meta) implementation call `check_rotary_args`.
The CUDA kernel repeats the same checks in C++ (csrc/ops.cpp), because a Python pre-check
would cost more host time per eager call than the kernel launch itself; it raises the same
Python exception types with the same messages, so every backend names the same argument.

These checks never read tensor data, so they cost no device sync and also run on fake
tensors. Position bounds need the data: the Torch implementation checks them on the CPU,
where its cache gather reads the positions anyway (`check_positions_in_range`); on other
devices a token whose position is outside `[0, cache rows)` is left untouched by every backend.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
POSITION_DTYPES = (torch.int32, torch.int64)



class RotaryShape(NamedTuple):
    num_tokens: int
    num_heads: int
    num_kv_heads: int
    rot_dim: int


def _heads(name: str, x: torch.Tensor, token_shape: torch.Size, head_size: int) -> int:
    """Number of heads in `x`, after checking its layout against the token dims."""
    shape, pd = x.shape, len(token_shape)
    if len(shape) not in (pd + 1, pd + 2):
        raise ValueError(
            f"{name}: expected {pd + 1} dims [*positions.shape, heads * head_size] or "
            f"{pd + 2} dims [*positions.shape, heads, head_size], got shape {tuple(shape)}"
        )
    if shape[:pd] != token_shape:
        raise ValueError(
            f"{name}: leading dims {tuple(shape[:pd])} must match positions.shape "
            f"{tuple(token_shape)} (the same number of tokens)"
        )
    if len(shape) == pd + 2:
        if shape[-1] != head_size:
            raise ValueError(f"{name}: last dim is {shape[-1]}, expected head_size={head_size}")
        heads = shape[-2]
    else:
        if shape[-1] % head_size != 0:
            raise ValueError(
                f"{name}: hidden size {shape[-1]} is not divisible by head_size={head_size}"
            )
        heads = shape[-1] // head_size
    if x.stride(-1) != 1 and x.numel() > 0:
        raise ValueError(f"{name}: last dim must be contiguous (stride 1), got stride {x.stride(-1)}")
    return heads


def check_rotary_args(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    rope_dim_offset: int = 0,
    cache_offsets: Optional[torch.Tensor] = None,
) -> RotaryShape:
    """Raise ValueError/TypeError/IndexError naming the bad argument; return derived sizes.

    Eager CPU calls run this on every call, so it reads each tensor attribute once.
    """
    token_shape = positions.shape
    if positions.dtype not in POSITION_DTYPES:
        raise TypeError(f"positions: expected dtype int32 or int64, got {positions.dtype}")
    if len(token_shape) not in (1, 2):
        raise ValueError(
            f"positions: expected shape [num_tokens] or [batch, seq_len], got {tuple(token_shape)}"
        )
    if not positions.is_contiguous():
        raise ValueError("positions: must be contiguous")
    dtype = query.dtype
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"query: expected dtype float32, float16 or bfloat16, got {dtype}")
    if key is not None and key.dtype != dtype:
        raise TypeError(f"key: dtype {key.dtype} must equal query's dtype {dtype}")
    if cos_sin_cache.dtype not in CACHE_DTYPES:
        raise TypeError(
            f"cos_sin_cache: expected a float dtype (float32, float16, bfloat16, float64), "
            f"got {cos_sin_cache.dtype}"
        )
    device = positions.device
    for name, t in (
        ("query", query), ("key", key), ("cos_sin_cache", cos_sin_cache),
        ("cos_sin_cache_offsets", cache_offsets),
    ):
        if t is not None and t.device != device:
            raise ValueError(
                f"{name}: on device {t.device}, but positions is on {device}; "
                "all tensors must be on one device"
            )
    if head_size <= 0:
        raise ValueError(f"head_size: must be positive, got {head_size}")
    cache_shape = cos_sin_cache.shape
    if len(cache_shape) != 2:
        raise ValueError(
            f"cos_sin_cache: expected 2 dims [max_position, rot_dim], got shape {tuple(cache_shape)}"
        )
    rot_dim = cache_shape[1]
    if rot_dim <= 0 or rot_dim % 2 != 0:
        raise ValueError(f"cos_sin_cache: rot_dim (size of dim 1) must be even and positive, got {rot_dim}")
    if cos_sin_cache.stride(1) != 1 and cache_shape[0] > 0:
        raise ValueError("cos_sin_cache: last dim must be contiguous (stride 1)")
    if rope_dim_offset < 0:
        raise ValueError(f"rope_dim_offset: must be >= 0, got {rope_dim_offset}")
    if rope_dim_offset + rot_dim > head_size:
        raise ValueError(
            f"rope_dim_offset + rot_dim = {rope_dim_offset} + {rot_dim} exceeds head_size={head_size}"
        )
    num_heads = _heads("query", query, token_shape, head_size)
    num_kv_heads = num_heads
    if key is not None:
        num_kv_heads = _heads("key", key, token_shape, head_size)
        if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
            raise ValueError(
                f"key: query heads ({num_heads}) must be a multiple of key heads ({num_kv_heads})"
            )
    num_tokens = positions.numel()
    if cache_offsets is not None:
        if cache_offsets.dtype not in POSITION_DTYPES:
            raise TypeError(
                f"cos_sin_cache_offsets: expected dtype int32 or int64, got {cache_offsets.dtype}"
            )
        if cache_offsets.numel() != num_tokens or not cache_offsets.is_contiguous():
            raise ValueError(
                f"cos_sin_cache_offsets: expected a contiguous tensor of {num_tokens} "
                f"elements (one per token), got shape {tuple(cache_offsets.shape)}"
            )
    return RotaryShape(num_tokens, num_heads, num_kv_heads, rot_dim)


def check_positions_in_range(rows: torch.Tensor, cache_rows: int) -> None:
    """Raise IndexError naming positions if a cache row index lies outside [0, cache_rows)."""
    lo, hi = (int(v) for v in torch.aminmax(rows))
    if lo < 0 or hi >= cache_rows:
        raise IndexError(
            f"positions: cache rows must lie in [0, {cache_rows}), got values in [{lo}, {hi}]"
        )
