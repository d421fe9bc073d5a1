"""sgl-kernel's fused KV-cache write, done after the rotation with Torch ops.

sgl-kernel's `apply_rope_with_cos_sin_cache_inplace` can, in the same kernel, store the
rotated key and the value of each token in the paged KV cache: token i goes to row
`cache_loc[i]` of `k_buffer` and `v_buffer`, every head and every dim of it (the
pass-through dims of a partial rotation included). Here that is two `index_copy_` calls
after the rotation, the rotated key read back from `key`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch


@dataclass
class FusedSetKVBufferArg:
    """Where to store the rotated key and the value; sgl-kernel's dataclass of this name.

    value: `[nnz, num_kv_heads * head_size]` or `[nnz, num_kv_heads, head_size]`.
    k_buffer, v_buffer: `[rows, num_kv_heads * head_size]` or `[rows, num_kv_heads,
    head_size]`, in the key's dtype (sgl-kernel stores without a cast).
    k_scale, v_scale: must be None (sgl-kernel does not support them either).
    cache_loc: int64 `[nnz]`, the buffer row of each token.
    """

    value: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    k_scale: Optional[float]
    v_scale: Optional[float]
    cache_loc: torch.Tensor


def _heads_view(name: str, x: torch.Tensor, head_size: int) -> torch.Tensor:
    """`x` viewed as `[rows, heads, head_size]` without a copy, as sgl-kernel views it."""
    flat_ok = x.dim() == 2 and x.shape[-1] % head_size == 0
    if not (flat_ok or (x.dim() == 3 and x.shape[-1] == head_size)):
        raise ValueError(
            f"fused_set_kv_buffer_arg.{name}: expected [rows, heads * {head_size}] or "
            f"[rows, heads, {head_size}], got shape {tuple(x.shape)}"
        )
    return x.view(x.shape[0], -1, head_size)


def kv_buffer_writer(
    arg: FusedSetKVBufferArg, key: Optional[torch.Tensor], num_tokens: int, head_size: int
) -> Callable[[], None]:
    """Check `arg` now; return the function that stores `key` and `arg.value` once rotated.

    `arg` may be any object with the dataclass's fields (sgl-kernel's own instances work;
    missing k_scale/v_scale count as None).
    """
    if key is None:
        raise ValueError("key: required when fused_set_kv_buffer_arg is given")
    for name in ("k_scale", "v_scale"):
        if getattr(arg, name, None) is not None:
            raise ValueError(
                f"fused_set_kv_buffer_arg.{name}: scaled KV-cache writes are not supported "
                "(nor by sgl-kernel); pass None"
            )
    loc = arg.cache_loc
    if loc.dtype != torch.int64 or loc.dim() != 1 or loc.numel() != num_tokens:
        raise ValueError(
            f"fused_set_kv_buffer_arg.cache_loc: expected int64 [{num_tokens}] (one row per "
            f"token), got {loc.dtype} {tuple(loc.shape)}"
        )
    if loc.device != key.device:
        raise ValueError(f"fused_set_kv_buffer_arg.cache_loc: on {loc.device}, key is on {key.device}")
    value = _heads_view("value", arg.value, head_size)
    k_buffer = _heads_view("k_buffer", arg.k_buffer, head_size)
    v_buffer = _heads_view("v_buffer", arg.v_buffer, head_size)
    kv_heads = key.numel() // max(num_tokens * head_size, 1)
    for name, t in (("value", value), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if t.dtype != key.dtype:
            raise TypeError(
                f"fused_set_kv_buffer_arg.{name}: dtype {t.dtype} must equal the key's dtype "
                f"{key.dtype} (sgl-kernel stores without a cast)"
            )
        if t.device != key.device:
            raise ValueError(f"fused_set_kv_buffer_arg.{name}: on {t.device}, key is on {key.device}")
        if t.shape[1] != kv_heads:
            raise ValueError(
                f"fused_set_kv_buffer_arg.{name}: {t.shape[1]} heads, the key has {kv_heads}"
            )
    if value.shape[0] != num_tokens:
        raise ValueError(
            f"fused_set_kv_buffer_arg.value: {value.shape[0]} rows, expected one per token ({num_tokens})"
        )

    def store() -> None:
        k_buffer.index_copy_(0, loc, key.reshape(num_tokens, kv_heads, head_size))
        v_buffer.index_copy_(0, loc, value)

    return store
