"""The op schemas, registered once with torch.library, and their Python implementations.

`rope_compat::rotary_embedding` has vLLM's schema, argument names included, so that code
and compiler passes written against `_C::rotary_embedding` read the same.
`rope_compat::batched_rotary_embedding` has the schema of vLLM's former multi-LoRA op.

The Torch implementation is registered as CompositeExplicitAutograd: it serves every device
(the CPU included) for which no backend kernel is registered. The compiled extension, when it
loads, registers its CUDA kernel for the CUDA dispatch key of these same ops.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import kv_store, mrope, torch_impl
from .checks import check_batched_types, check_no_grad, check_rotary_args, check_rotary_types

NAMESPACE = "rope_compat"

ROTARY_SCHEMA = (
    "rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, bool inverse=False) -> ()"
)
BATCHED_SCHEMA = (
    "batched_rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox, int rot_dim, Tensor cos_sin_cache_offsets) -> ()"
)

lib = torch.library.Library(NAMESPACE, "DEF")
lib.define(ROTARY_SCHEMA)
lib.define(BATCHED_SCHEMA)
# Rope, then token t's rotated key and value stored at row cache_loc[t] of k_buffer/v_buffer
# (ops/kv_store.py); the CUDA kernel does both in one launch.
SET_KV_SCHEMA = (
    "rotary_embedding_set_kv(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox, Tensor value, Tensor(c!) k_buffer, Tensor(d!) v_buffer, "
    "Tensor cache_loc, float? k_scale=None, float? v_scale=None, int rope_dim_offset=0) -> ()"
)
lib.define(SET_KV_SCHEMA)
# Multimodal RoPE: positions [3, T], pair i rotated by row positions[section(i), t] (ops/mrope.py).
MROPE_SCHEMA = (
    "mrope_rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox, int[] mrope_section, bool mrope_interleaved=False, "
    "int rope_dim_offset=0, bool inverse=False) -> ()"
)
lib.define(MROPE_SCHEMA)
# MRoPE, then the store of rotary_embedding_set_kv (ops/mrope.py, ops/kv_store.py); one CUDA launch.
MROPE_SET_KV_SCHEMA = (
    "mrope_rotary_embedding_set_kv(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox, int[] mrope_section, Tensor value, Tensor(c!) k_buffer, "
    "Tensor(d!) v_buffer, Tensor cache_loc, float? k_scale=None, float? v_scale=None, "
    "bool mrope_interleaved=False, int rope_dim_offset=0) -> ()"
)
lib.define(MROPE_SET_KV_SCHEMA)


def _check_batched_rot_dim(rot_dim: int, cos_sin_cache: torch.Tensor) -> None:
    if cos_sin_cache.dim() >= 1 and rot_dim != cos_sin_cache.shape[-1]:
        raise ValueError(
            f"rot_dim: {rot_dim} must equal cos_sin_cache.shape[1] = {cos_sin_cache.shape[-1]}"
        )


@torch.library.impl(lib, "rotary_embedding", "CompositeExplicitAutograd")
def _rotary_torch(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    rope_dim_offset: int = 0,
    inverse: bool = False,
) -> None:
    torch_impl.rotary_embedding(
        positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse
    )


@torch.library.impl(lib, "batched_rotary_embedding", "CompositeExplicitAutograd")
def _batched_torch(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    rot_dim: int,
    cos_sin_cache_offsets: torch.Tensor,
) -> None:
    check_batched_types(positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim, cos_sin_cache_offsets)
    _check_batched_rot_dim(rot_dim, cos_sin_cache)
    torch_impl.rotary_embedding(
        positions, query, key, head_size, cos_sin_cache, is_neox,
        cache_offsets=cos_sin_cache_offsets,
    )


@torch.library.register_fake(f"{NAMESPACE}::rotary_embedding", lib=lib)
def _rotary_fake(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0, inverse=False):
    check_rotary_types(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse)
    check_rotary_args(
        positions, query, key, head_size, cos_sin_cache, rope_dim_offset
    )
    check_no_grad(query, key)


@torch.library.register_fake(f"{NAMESPACE}::batched_rotary_embedding", lib=lib)
def _batched_fake(positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim, cos_sin_cache_offsets):
    check_batched_types(positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim, cos_sin_cache_offsets)
    _check_batched_rot_dim(rot_dim, cos_sin_cache)
    check_rotary_args(
        positions, query, key, head_size, cos_sin_cache,
        cache_offsets=cos_sin_cache_offsets,
    )
    check_no_grad(query, key)


@torch.library.impl(lib, "rotary_embedding_set_kv", "CompositeExplicitAutograd")
def _set_kv_torch(positions, query, key, head_size, cos_sin_cache, is_neox, value, k_buffer, v_buffer,
                  cache_loc, k_scale=None, v_scale=None, rope_dim_offset=0):
    kv_store.rotary_embedding_set_kv(
        positions, query, key, head_size, cos_sin_cache, is_neox, value, k_buffer, v_buffer,
        cache_loc, k_scale, v_scale, rope_dim_offset,
    )


@torch.library.register_fake(f"{NAMESPACE}::rotary_embedding_set_kv", lib=lib)
def _set_kv_fake(positions, query, key, head_size, cos_sin_cache, is_neox, value, k_buffer, v_buffer,
                 cache_loc, k_scale=None, v_scale=None, rope_dim_offset=0):
    kv_store.check_kv_store_args(
        positions, query, key, head_size, cos_sin_cache, value, k_buffer, v_buffer,
        cache_loc, k_scale, v_scale, rope_dim_offset,
    )
    check_no_grad(query, key, ("k_buffer", k_buffer), ("v_buffer", v_buffer))


@torch.library.impl(lib, "mrope_rotary_embedding", "CompositeExplicitAutograd")
def _mrope_torch(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section,
                 mrope_interleaved=False, rope_dim_offset=0, inverse=False):
    mrope.mrope_rotary_embedding(
        positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section,
        mrope_interleaved, rope_dim_offset, inverse,
    )


@torch.library.register_fake(f"{NAMESPACE}::mrope_rotary_embedding", lib=lib)
def _mrope_fake(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section,
                mrope_interleaved=False, rope_dim_offset=0, inverse=False):
    mrope.check_mrope_args(positions, query, key, head_size, cos_sin_cache, mrope_section, rope_dim_offset)


@torch.library.impl(lib, "mrope_rotary_embedding_set_kv", "CompositeExplicitAutograd")
def _mrope_set_kv_torch(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, value, k_buffer,
                        v_buffer, cache_loc, k_scale=None, v_scale=None, mrope_interleaved=False, rope_dim_offset=0):
    mrope.mrope_rotary_embedding_set_kv(
        positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, value, k_buffer, v_buffer,
        cache_loc, k_scale, v_scale, mrope_interleaved, rope_dim_offset,
    )


@torch.library.register_fake(f"{NAMESPACE}::mrope_rotary_embedding_set_kv", lib=lib)
def _mrope_set_kv_fake(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, value, k_buffer,
                       v_buffer, cache_loc, k_scale=None, v_scale=None, mrope_interleaved=False, rope_dim_offset=0):
    mrope.check_mrope_set_kv_args(
        positions, query, key, head_size, cos_sin_cache, mrope_section, value, k_buffer, v_buffer,
        cache_loc, k_scale, v_scale, rope_dim_offset,
    )


mrope_rotary_embedding_set_kv_op = torch.ops.rope_compat.mrope_rotary_embedding_set_kv.default
mrope_rotary_embedding_op = torch.ops.rope_compat.mrope_rotary_embedding.default
rotary_embedding_set_kv_op = torch.ops.rope_compat.rotary_embedding_set_kv.default
rotary_embedding_op = torch.ops.rope_compat.rotary_embedding.default
batched_rotary_embedding_op = torch.ops.rope_compat.batched_rotary_embedding.default
