"""Rope with the KV-cache store: checks and Torch implementation of `rotary_embedding_set_kv`.

After the rotation, token t's rotated key and its value are stored at row `cache_loc[t]` of
`k_buffer` and `v_buffer`, every head and every dim (pass-through dims included), as
sgl-kernel's fused call does. Beyond sgl-kernel: any float buffer dtype (float8 included);
stored = key / k_scale and value / v_scale computed in float32 and rounded once to the
buffer dtype (no scale: the key and value as they are, converted).

A `cache_loc` outside `[0, buffer rows)` (-1 included) stores nothing for that token, on
every device: a bounds check on the host would need the data (a sync on a GPU).
Duplicate `cache_loc` values store one of the tokens, unspecified which (as index_copy_).

Buffers: `[rows, heads * head_size]`, `[rows, heads, head_size]` or pages
`[pages, page_size, heads, head_size]` (rows = pages * page_size, `cache_loc` the slot index;
the page stride must be page_size row strides).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .checks import (
    POSITION_DTYPES, RotaryShape, _heads, check_no_grad, check_rotary_args, check_set_kv_types,
)
from . import torch_impl

BUFFER_DTYPES = (
    torch.float32, torch.float16, torch.bfloat16, torch.float64,
    torch.float8_e4m3fn, torch.float8_e5m2,
)
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


class BufferLayout(NamedTuple):
    rows: int
    row_stride: int
    head_stride: int


def _buffer_layout(name: str, buf: torch.Tensor, kv_heads: int, head_size: int) -> BufferLayout:
    """Rows and strides of a KV buffer, in elements; ValueError naming it for a bad layout."""
    shape, dim = buf.shape, buf.dim()
    expected = (
        f"{name}: expected [rows, heads * head_size], [rows, heads, head_size] or "
        f"[pages, page_size, heads, head_size] with heads={kv_heads}, head_size={head_size}, "
        f"got shape {tuple(shape)}"
    )
    if dim == 2:
        if shape[1] != kv_heads * head_size:
            raise ValueError(expected)
        layout = BufferLayout(shape[0], buf.stride(0), head_size)
    elif dim in (3, 4):
        if shape[-1] != head_size or shape[-2] != kv_heads:
            raise ValueError(expected)
        rows = shape[0] if dim == 3 else shape[0] * shape[1]
        if dim == 4 and shape[0] > 1 and buf.stride(0) != shape[1] * buf.stride(1):
            raise ValueError(
                f"{name}: page stride {buf.stride(0)} must be page_size * row stride = "
                f"{shape[1]} * {buf.stride(1)} (pages viewed as one array of slots)"
            )
        layout = BufferLayout(rows, buf.stride(dim - 3), buf.stride(-2))
    else:
        raise ValueError(expected)
    if buf.numel() > 0 and buf.stride(-1) != 1:
        raise ValueError(f"{name}: last dim must be contiguous (stride 1), got stride {buf.stride(-1)}")
    return layout


def _check_scale(name: str, scale: Optional[float]) -> None:
    if scale is not None and not (scale > 0 and scale != float("inf")):
        raise ValueError(f"{name}: must be a positive finite float or None, got {scale}")


class KVStoreShape(NamedTuple):
    k: BufferLayout
    v: BufferLayout


def check_kv_store_args(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    value: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    cache_loc: torch.Tensor,
    k_scale: Optional[float],
    v_scale: Optional[float],
    rope_dim_offset: int = 0,
) -> KVStoreShape:
    """The rotary checks, then the store's; errors name the argument. Reads no tensor data."""
    head_size, rope_dim_offset = check_set_kv_types(
        positions, query, key, head_size, cos_sin_cache, False, value, k_buffer, v_buffer,
        cache_loc, k_scale, v_scale, rope_dim_offset,
    )
    shape = check_rotary_args(positions, query, key, head_size, cos_sin_cache, rope_dim_offset)
    return check_store_args(positions, key, head_size, shape, value, k_buffer, v_buffer, cache_loc, k_scale, v_scale)


def check_store_args(
    positions: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    shape: RotaryShape,
    value: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    cache_loc: torch.Tensor,
    k_scale: Optional[float],
    v_scale: Optional[float],
) -> KVStoreShape:
    """The store's checks alone, after the rotary ones (`shape`); `positions` has the token
    dims (MRoPE passes one of its rows). Shared by every op with the store (the C++
    check_store in csrc/checks.h mirrors it)."""
    kv_heads = shape.num_kv_heads
    device = positions.device
    for name, t in (("value", value), ("k_buffer", k_buffer), ("v_buffer", v_buffer), ("cache_loc", cache_loc)):
        if t.device != device:
            raise ValueError(
                f"{name}: on device {t.device}, but positions is on {device}; "
                "all tensors must be on one device"
            )
    if value.dtype != key.dtype:
        raise TypeError(f"value: dtype {value.dtype} must equal the key's dtype {key.dtype}")
    value_heads = _heads("value", value, positions.shape, head_size)
    if value_heads != kv_heads:
        raise ValueError(f"value: {value_heads} heads, the key has {kv_heads}")
    if k_buffer.dtype not in BUFFER_DTYPES:
        raise TypeError(
            "k_buffer: expected dtype float32, float16, bfloat16, float64, float8_e4m3fn or "
            f"float8_e5m2, got {k_buffer.dtype}"
        )
    if v_buffer.dtype != k_buffer.dtype:
        raise TypeError(f"v_buffer: dtype {v_buffer.dtype} must equal k_buffer's dtype {k_buffer.dtype}")
    k_layout = _buffer_layout("k_buffer", k_buffer, kv_heads, head_size)
    v_layout = _buffer_layout("v_buffer", v_buffer, kv_heads, head_size)
    if cache_loc.dtype not in POSITION_DTYPES:
        raise TypeError(f"cache_loc: expected dtype int32 or int64, got {cache_loc.dtype}")
    if cache_loc.numel() != shape.num_tokens or not cache_loc.is_contiguous():
        raise ValueError(
            f"cache_loc: expected a contiguous tensor of {shape.num_tokens} elements (one "
            f"buffer row per token), got shape {tuple(cache_loc.shape)}"
        )
    _check_scale("k_scale", k_scale)
    _check_scale("v_scale", v_scale)
    return KVStoreShape(k_layout, v_layout)


def _store_rows(
    buf: torch.Tensor, layout: BufferLayout, loc: torch.Tensor, src: torch.Tensor,
    scale: Optional[float],
) -> None:
    """buf[loc[t]] = src[t] / scale for the tokens whose loc is a row of buf."""
    heads, head_size = src.shape[1], src.shape[2]
    vals = (src.float() / scale if scale is not None else src).to(buf.dtype)
    if buf.dtype in _FP8:  # index_copy_ has no float8 kernels: copy the bytes
        buf, vals = buf.view(torch.uint8), vals.view(torch.uint8)
    rows = buf.as_strided(
        (layout.rows, heads, head_size), (layout.row_stride, layout.head_stride, 1), buf.storage_offset()
    )
    keep = ((loc >= 0) & (loc < layout.rows)).nonzero().squeeze(1)
    rows.index_copy_(0, loc[keep], vals[keep])


def rotary_embedding_set_kv(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    value: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    cache_loc: torch.Tensor,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    rope_dim_offset: int = 0,
) -> None:
    """Rotate query and key in place, then store the key and value rows (see module doc)."""
    head_size, rope_dim_offset = check_set_kv_types(
        positions, query, key, head_size, cos_sin_cache, is_neox, value, k_buffer, v_buffer,
        cache_loc, k_scale, v_scale, rope_dim_offset,
    )
    layouts = check_kv_store_args(
        positions, query, key, head_size, cos_sin_cache, value, k_buffer, v_buffer,
        cache_loc, k_scale, v_scale, rope_dim_offset,
    )
    check_no_grad(query, key, ("k_buffer", k_buffer), ("v_buffer", v_buffer))
    num_tokens = positions.numel()
    if num_tokens == 0 or key.numel() == 0:
        return
    # First the rotation: on the CPU it raises for positions outside the cache before it
    # writes anything, so nothing is stored either.
    torch_impl.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset)
    store_key_value(key, value, k_buffer, v_buffer, layouts, cache_loc, k_scale, v_scale, head_size)


def store_key_value(
    key: torch.Tensor, value: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    layouts: KVStoreShape, cache_loc: torch.Tensor, k_scale: Optional[float], v_scale: Optional[float],
    head_size: int,
) -> None:
    """The store after the rotation: token t's key and value rows at cache_loc[t] (checked args)."""
    num_tokens = cache_loc.numel()
    loc = cache_loc.reshape(-1).long()
    kv_heads = key.numel() // (num_tokens * head_size)
    with torch.no_grad():
        _store_rows(k_buffer, layouts.k, loc, key.reshape(num_tokens, kv_heads, head_size), k_scale)
        _store_rows(v_buffer, layouts.v, loc, value.reshape(num_tokens, kv_heads, head_size), v_scale)
