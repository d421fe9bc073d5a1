"""Argument checks for the rotary ops: the one statement of what the op accepts.

The Torch implementation and the fake (meta) implementation call `check_rotary_args`.
The CUDA kernel repeats the same checks in C++ (csrc/rotary_embedding.cpp), because a
Python pre-check would cost more host time per eager call than the kernel launch itself;
its messages carry a `[ValueError]`-style tag that `raise_translated` turns back into the
Python exception type, so every backend raises the same type naming the same argument.

Checks never read tensor data on an accelerator (that would sync the host). Position
bounds are therefore checked only for CPU tensors; on other devices a token whose
position is outside `[0, cache rows)` is left untouched by every backend.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
POSITION_DTYPES = (torch.int32, torch.int64)

_TAGS = {"[ValueError] ": ValueError, "[TypeError] ": TypeError, "[IndexError] ": IndexError}


class RotaryShape(NamedTuple):
    num_tokens: int
    num_heads: int
    num_kv_heads: int
    rot_dim: int


def _heads(name: str, x: torch.Tensor, positions: torch.Tensor, head_size: int) -> int:
    """Number of heads in `x`, after checking its layout against `positions`."""
    pd = positions.dim()
    if x.dim() not in (pd + 1, pd + 2):
        raise ValueError(
            f"{name}: expected {pd + 1} dims [*positions.shape, heads * head_size] or "
            f"{pd + 2} dims [*positions.shape, heads, head_size], got shape {tuple(x.shape)}"
        )
    if tuple(x.shape[:pd]) != tuple(positions.shape):
        raise ValueError(
            f"{name}: leading dims {tuple(x.shape[:pd])} must match positions.shape "
            f"{tuple(positions.shape)} (the same number of tokens)"
        )
    if x.dim() == pd + 2:
        if x.shape[-1] != head_size:
            raise ValueError(f"{name}: last dim is {x.shape[-1]}, expected head_size={head_size}")
        heads = x.shape[-2]
    else:
        if x.shape[-1] % head_size != 0:
            raise ValueError(
                f"{name}: hidden size {x.shape[-1]} is not divisible by head_size={head_size}"
            )
        heads = x.shape[-1] // head_size
    if x.numel() > 0 and x.stride(-1) != 1:
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
    check_bounds: bool = True,
) -> RotaryShape:
    """Raise ValueError/TypeError/IndexError naming the bad argument; return derived sizes."""
    if positions.dtype not in POSITION_DTYPES:
        raise TypeError(f"positions: expected dtype int32 or int64, got {positions.dtype}")
    if positions.dim() not in (1, 2):
        raise ValueError(
            f"positions: expected shape [num_tokens] or [batch, seq_len], got {tuple(positions.shape)}"
        )
    if not positions.is_contiguous():
        raise ValueError("positions: must be contiguous")
    if query.dtype not in FLOAT_DTYPES:
        raise TypeError(f"query: expected dtype float32, float16 or bfloat16, got {query.dtype}")
    if key is not None and key.dtype != query.dtype:
        raise TypeError(f"key: dtype {key.dtype} must equal query's dtype {query.dtype}")
    if cos_sin_cache.dtype not in CACHE_DTYPES:
        raise TypeError(
            f"cos_sin_cache: expected a float dtype (float32, float16, bfloat16, float64), "
            f"got {cos_sin_cache.dtype}"
        )
    tensors = [("positions", positions), ("query", query), ("cos_sin_cache", cos_sin_cache)]
    if key is not None:
        tensors.append(("key", key))
    if cache_offsets is not None:
        tensors.append(("cos_sin_cache_offsets", cache_offsets))
    for name, t in tensors[1:]:
        if t.device != positions.device:
            raise ValueError(
                f"{name}: on device {t.device}, but positions is on {positions.device}; "
                "all tensors must be on one device"
            )
    if head_size <= 0:
        raise ValueError(f"head_size: must be positive, got {head_size}")
    if cos_sin_cache.dim() != 2:
        raise ValueError(
            f"cos_sin_cache: expected 2 dims [max_position, rot_dim], got shape "
            f"{tuple(cos_sin_cache.shape)}"
        )
    rot_dim = cos_sin_cache.shape[1]
    if rot_dim <= 0 or rot_dim % 2 != 0:
        raise ValueError(f"cos_sin_cache: rot_dim (size of dim 1) must be even and positive, got {rot_dim}")
    if cos_sin_cache.numel() > 0 and cos_sin_cache.stride(1) != 1:
        raise ValueError("cos_sin_cache: last dim must be contiguous (stride 1)")
    if rope_dim_offset < 0:
        raise ValueError(f"rope_dim_offset: must be >= 0, got {rope_dim_offset}")
    if rope_dim_offset + rot_dim > head_size:
        raise ValueError(
            f"rope_dim_offset + rot_dim = {rope_dim_offset} + {rot_dim} exceeds head_size={head_size}"
        )
    num_heads = _heads("query", query, positions, head_size)
    num_kv_heads = num_heads
    if key is not None:
        num_kv_heads = _heads("key", key, positions, head_size)
        if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
            raise ValueError(
                f"key: query heads ({num_heads}) must be a multiple of key heads ({num_kv_heads})"
            )
    if cache_offsets is not None:
        if cache_offsets.dtype not in POSITION_DTYPES:
            raise TypeError(
                f"cos_sin_cache_offsets: expected dtype int32 or int64, got {cache_offsets.dtype}"
            )
        if cache_offsets.numel() != positions.numel() or not cache_offsets.is_contiguous():
            raise ValueError(
                f"cos_sin_cache_offsets: expected a contiguous tensor of {positions.numel()} "
                f"elements (one per token), got shape {tuple(cache_offsets.shape)}"
            )
    if check_bounds and positions.device.type == "cpu" and positions.numel() > 0:
        # Cheap on CPU (no device sync); elsewhere the kernels skip such tokens instead.
        rows = positions.reshape(-1).to(torch.int64)
        if cache_offsets is not None:
            rows = rows + cache_offsets.reshape(-1)
        lo, hi = int(rows.min()), int(rows.max())
        if lo < 0 or hi >= cos_sin_cache.shape[0]:
            raise IndexError(
                f"positions: cache rows must lie in [0, {cos_sin_cache.shape[0]}), got values in "
                f"[{lo}, {hi}]"
            )
    return RotaryShape(positions.numel(), num_heads, num_kv_heads, rot_dim)


def raise_translated(err: RuntimeError) -> None:
    """Re-raise a tagged error from the compiled kernel as its Python exception type."""
    msg = str(err)
    for tag, exc in _TAGS.items():
        i = msg.find(tag)
        if i >= 0:
            text = msg[i + len(tag):].split("\n", 1)[0]
            raise exc(text) from None
    raise err
