"""SGLang's public rope entry points, with SGLang's signatures, served by rope-compat's op.

The names and signatures of `sglang.kernels.ops.attention.rope` (SGLang 0.5.20 and newer),
`sglang.jit_kernel.rope` (0.5.10-0.5.16) and `sglang.jit_kernel.pos_enc`:

- `apply_rope_with_cos_sin_cache_inplace(q, k, cos_sin_cache, positions, *, is_neox,
  rope_dim=0, fused_args=None)`: what SGLang's RotaryEmbedding.forward_cuda calls;
- `apply_rope_inplace(q, k, cos_sin_cache, positions, *, is_neox, rope_dim=0)`;
- `apply_rope_inplace_with_kvcache(q, k, v, k_cache, v_cache, cos_sin_cache, positions,
  out_loc, *, is_neox, rope_dim=0)`;
- `rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox=True)`, vLLM's
  op under SGLang's name, returning `(query, key)`;
- `FusedSetKVBufferArg`: SGLang's 4-field form `(value, k_buffer, v_buffer, cache_loc)` and
  sgl-kernel's 6-field one (with k_scale, v_scale) both work.

Semantics, as SGLang's kernel: q `[num_tokens, num_qo_heads, rope_dim]` and k `[num_tokens,
num_kv_heads, rope_dim]`, last dim contiguous, any other strides (SGLang passes views of the
heads, sliced to the rotary dims for partial rotation); every dim of each such head rotates
in place by the angle of `cos_sin_cache[positions[t]]` (rows `[cos | sin]`), NeoX style
(halves) if `is_neox` else GPT-J style (interleaved pairs). `rope_dim` 0 means
`cos_sin_cache.size(-1)`; otherwise it must equal it. With `fused_args`, token t's rotated
key and its value are also stored at row `cache_loc[t]` of `k_buffer` / `v_buffer` (one
launch on CUDA, rope_compat/ops/kv_store.py).

The head size given to the op is `cos_sin_cache.size(-1)` (= rope_dim, as in SGLang), so a
q or k whose last dim differs is refused by name (ValueError), as SGLang's kernel refuses it.

Wider than SGLang's kernel, never different where SGLang's runs: the cache may be any float
dtype (SGLang's needs float32), positions and cache_loc may differ in integer dtype, q/k may
also be `[num_tokens, heads * rope_dim]`, k may be None, buffers may be float8 with scales or
paged, and a `cache_loc` outside the buffer stores nothing (SGLang's kernel writes out of
bounds). q and k must share one dtype (SGLang's allows same-size pairs such as float16 q
with bfloat16 k).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import api
from .compat.sgl import FusedSetKVBufferArg, rope_and_store

__all__ = [
    "apply_rope_with_cos_sin_cache_inplace",
    "apply_rope_inplace",
    "apply_rope_inplace_with_kvcache",
    "rotary_embedding",
    "FusedSetKVBufferArg",
]

# The compiled entry point where the CUDA extension is built (a C function: a positional
# call with plain CUDA tensors launches the kernel with no Python frame), else the Python one.
_rotary = api.rotary_embedding

# (the last cos_sin_cache seen, its size(-1)): the head size of SGLang's views is rope_dim,
# which is the cache's width. Reading a tensor attribute costs more host time than the rest
# of this wrapper, and SGLang passes the same cache tensor on every call of a layer.
_last_cache = (None, 0)


def _head(cos_sin_cache: torch.Tensor) -> int:
    global _last_cache
    cache, head = _last_cache
    if cache is not cos_sin_cache:
        head = cos_sin_cache.shape[-1]
        _last_cache = (cos_sin_cache, head)
    return head


def apply_rope_with_cos_sin_cache_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    is_neox: bool,
    rope_dim: int = 0,
    fused_args: Optional[FusedSetKVBufferArg] = None,
) -> None:
    """Rotate q and k in place; with `fused_args`, also store the key and value rows."""
    # The decode-step calls (where this function serves them: without the extension, whose
    # compiled form below takes them otherwise): one frame over rotary_embedding or
    # rope_and_store, no tensor read.
    if not rope_dim:
        cache, head = _last_cache
        if cache is not cos_sin_cache:
            head = _head(cos_sin_cache)
        if fused_args is None:
            _rotary(positions, q, k, head, cos_sin_cache, is_neox)
        else:
            rope_and_store(fused_args, positions, q, k, head, cos_sin_cache, is_neox)
        return
    _general(q, k, cos_sin_cache, positions, is_neox, rope_dim, fused_args)


_python_apply_rope_with_cos_sin_cache_inplace = apply_rope_with_cos_sin_cache_inplace
# Where the extension is built, the compiled form: it sorts out SGLang's keywords in C and goes
# on to the same entry points as the function above, which takes every call it does not.
apply_rope_with_cos_sin_cache_inplace = api.compiled_entry(  # type: ignore[assignment]  # noqa: F811
    "apply_rope_with_cos_sin_cache_inplace", _python_apply_rope_with_cos_sin_cache_inplace
)


def _general(q, k, cos_sin_cache, positions, is_neox, rope_dim, fused_args) -> None:
    head = _head(cos_sin_cache)
    if rope_dim and rope_dim != head:
        raise ValueError(f"rope_dim: {rope_dim} must equal cos_sin_cache.size(-1) = {head} (or be 0)")
    if fused_args is None:
        _rotary(positions, q, k, head, cos_sin_cache, is_neox)
    else:
        rope_and_store(fused_args, positions, q, k, head, cos_sin_cache, is_neox)


def apply_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    is_neox: bool,
    rope_dim: int = 0,
) -> None:
    """Rotate q `[T, Hq, rope_dim]` and k `[T, Hk, rope_dim]` in place."""
    if not rope_dim:
        cache, head = _last_cache
        if cache is not cos_sin_cache:
            head = _head(cos_sin_cache)
        _rotary(positions, q, k, head, cos_sin_cache, is_neox)
        return
    _general(q, k, cos_sin_cache, positions, is_neox, rope_dim, None)


class _Store:
    """The fields rope_and_store reads, from apply_rope_inplace_with_kvcache's arguments."""

    __slots__ = ("value", "k_buffer", "v_buffer", "cache_loc", "k_scale", "v_scale")

    def __init__(self, value, k_buffer, v_buffer, cache_loc):
        self.value, self.k_buffer, self.v_buffer, self.cache_loc = value, k_buffer, v_buffer, cache_loc
        self.k_scale = self.v_scale = None


def apply_rope_inplace_with_kvcache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    out_loc: torch.Tensor,
    *,
    is_neox: bool,
    rope_dim: int = 0,
) -> None:
    """Rotate q and k in place, and store the rotated k and v at rows `out_loc` of the caches."""
    _general(q, k, cos_sin_cache, positions, is_neox, rope_dim, _Store(v, k_cache, v_cache, out_loc))


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """vLLM's op (in place, any layout it takes); returns `(query, key)` as SGLang's does."""
    _rotary(positions, query, key, head_size, cos_sin_cache, is_neox)
    return query, key
