"""sgl-kernel's fused KV-cache write: `FusedSetKVBufferArg` and the call that serves it.

sgl-kernel's `apply_rope_with_cos_sin_cache_inplace` can, in the same kernel, store the
rotated key and the value of each token in the paged KV cache: token i goes to row
`cache_loc[i]` of `k_buffer` and `v_buffer`, every head and every dim of it (the
pass-through dims of a partial rotation included). Here that is the registered op
`rotary_embedding_set_kv` (one kernel launch on CUDA), which also takes k_scale/v_scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..ops.library import rotary_embedding_set_kv_op


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


def rope_and_store(
    arg: "FusedSetKVBufferArg",
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Rotate `query`/`key` and store the key and `arg.value` at rows `arg.cache_loc`: one op.

    `arg` may be any object with the dataclass's fields (sgl-kernel's and SGLang's instances
    work; missing k_scale/v_scale count as None). Every check runs before anything is written.
    Wider than sgl-kernel: buffers of any float dtype (float8 included), also as pages
    `[pages, page_size, heads, head_size]`; k_scale/v_scale (stored = key / k_scale, rounded
    once); int32 or int64 cache_loc; rows outside the buffer (-1 included) are not stored.
    """
    if key is None:
        raise ValueError("key: required when fused_set_kv_buffer_arg is given")
    rotary_embedding_set_kv_op(
        positions, query, key, head_size, cos_sin_cache, is_neox, arg.value, arg.k_buffer,
        arg.v_buffer, arg.cache_loc, _scale(getattr(arg, "k_scale", None)),
        _scale(getattr(arg, "v_scale", None)),
    )


def _scale(s) -> Optional[float]:
    """A scale as a float (SGLang passes floats; a one-element tensor would cost a sync)."""
    return None if s is None else float(s)
