"""The Torch implementation of the rotary ops: the specification in code, and the fallback.

It serves every device that has no compiled kernel (the CPU included) and is what
`torch.compile` benchmarks compile. Math is float32 whatever the input dtypes, rounded once
to the tensor dtype, as vLLM's kernel does: each rotated pair (x, y) of a head becomes
(x*c - y*s, y*c + x*s), with c and s read from the token's cache row.

Written for the CPU, where it is the fallback:
- cos and sin are gathered once for all tokens (the gather also checks the positions);
- tokens are rotated in blocks whose float32 temporaries stay about `_BLOCK_BYTES`: fresh
  buffers of tens of MB cost page faults on every call, and small ones stay in cache;
- each block costs two products and two fused multiply-adds over the pair halves (plus a
  float32 copy in and out for f16/bf16), with two half-size temporaries.
On a decode-sized call the cost is per-op overhead, not arithmetic: the op count is the
thing to keep low there.
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch

from .checks import (
    RotaryShape, check_no_grad, check_positions_in_range, check_rotary_args, check_rotary_types,
    check_tensor,
)

# Float32 bytes of the rotated part of q and k per block of tokens. Measured on a 2-core
# x86 machine (1 MB L2 per core): smaller blocks pay per-op overhead more often, larger
# ones fall out of cache and fault in fresh pages.
_BLOCK_BYTES = 2 << 20


def _cache_rows_checked(rows: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Cache rows `rows` (CPU); IndexError naming positions for a row outside the cache."""
    # index_select refuses rows outside the cache (negative ones included), before anything
    # is written: the bounds check costs nothing extra here. Its errors (IndexError, or
    # RuntimeError for an empty cache) become the documented one.
    try:
        return cos_sin_cache.index_select(0, rows)
    except (IndexError, RuntimeError):
        check_positions_in_range(rows, cos_sin_cache.shape[0])
        raise


def _cache_rows_or_identity(rows: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Cache rows `rows`, and the identity rotation (cos 1, sin 0) for rows outside the cache.

    For accelerators, where checking bounds on the host would sync: such a token is left as
    it was, like the CUDA kernel leaves it.
    """
    n = cos_sin_cache.shape[0]
    valid = ((rows >= 0) & (rows < n)).unsqueeze(-1)
    if n == 0:  # nothing can be gathered: every token gets the identity
        cs = cos_sin_cache.new_zeros(rows.numel(), cos_sin_cache.shape[1])
    else:
        cs = cos_sin_cache.index_select(0, rows.clamp(0, n - 1))
    half = cs.shape[-1] // 2
    identity = torch.cat([torch.ones_like(cs[:, :half]), torch.zeros_like(cs[:, half:])], -1)
    return torch.where(valid, cs, identity)


def _gather_cos_sin(
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    inverse: bool,
    cache_offsets: Optional[torch.Tensor],
    math_dtype: torch.dtype = torch.float32,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """cos, sin and -sin per token in `math_dtype`, each [*positions.shape, 1, rot_dim / 2].

    The 1 broadcasts over heads. `inverse` negates the angle, i.e. swaps sin and -sin.
    """
    rows = positions.view(-1)
    if cache_offsets is not None:
        rows = rows.long() + cache_offsets.view(-1)  # in int64: an int32 sum could wrap
    if rows.is_cpu:
        cs = _cache_rows_checked(rows, cos_sin_cache)
    else:
        cs = _cache_rows_or_identity(rows, cos_sin_cache)
    cos, sin = cs.to(math_dtype).view(*positions.shape, 1, 2, -1).unbind(-2)
    neg_sin = -sin
    return (cos, neg_sin, sin) if inverse else (cos, sin, neg_sin)


def _rotate_(
    x: torch.Tensor,
    head_size: int,
    rope_dim_offset: int,
    rot_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    neg_sin: torch.Tensor,
    is_neox: bool,
) -> None:
    """Rotate the heads of `x` ([*tokens, H * head_size] or [*tokens, H, head_size]) in place."""
    token_dims = cos.dim() - 2
    heads = x if x.dim() == token_dims + 2 else x.unflatten(-1, (-1, head_size))
    part = heads if rot_dim == head_size else heads[..., rope_dim_offset : rope_dim_offset + rot_dim]
    # [*tokens, H, 2, rot_dim / 2]: row 0 holds the first element of every pair, row 1 the
    # second; NeoX pairs are the two halves of the rotated part, GPT-J pairs are neighbours.
    half = rot_dim // 2
    if is_neox:
        pairs = part.unflatten(-1, (2, half))
    else:
        pairs = part.unflatten(-1, (half, 2)).transpose(-1, -2)
    work = pairs.to(cos.dtype)  # a float32 copy for f16/bf16; `pairs` itself for float32 (float64)
    a, b = work.unbind(-2)
    b_neg_sin = b * neg_sin  # both products read the inputs before a and b are overwritten
    a_sin = a * sin
    torch.addcmul(b_neg_sin, a, cos, out=a)  # a*c - b*s
    torch.addcmul(a_sin, b, cos, out=b)  # b*c + a*s
    if work is not pairs:
        pairs.copy_(work)


def _token_blocks(token_shape: torch.Size, block: int) -> Iterator[tuple]:
    """Indices that split the token dims ([T] or [B, S]) into blocks of at most `block` tokens."""
    if len(token_shape) == 1:
        for t in range(0, token_shape[0], block):
            yield (slice(t, t + block),)
        return
    batch, seq = token_shape
    if seq > block:  # split each sequence
        for b in range(batch):
            for s in range(0, seq, block):
                yield (b, slice(s, s + block))
    else:  # whole sequences per block
        per_block = block // seq
        for b in range(0, batch, per_block):
            yield (slice(b, b + per_block),)


def _rotate_tokens(
    positions: torch.Tensor,
    tensors: Tuple[torch.Tensor, ...],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    rope_dim_offset: int,
    inverse: bool,
    cache_offsets: Optional[torch.Tensor],
    shape: RotaryShape,
) -> None:
    """Rotate `tensors` (checked, non-empty) in blocks of tokens."""
    math_dtype = torch.float64 if tensors[0].dtype == torch.float64 else torch.float32
    cos, sin, neg_sin = _gather_cos_sin(positions, cos_sin_cache, inverse, cache_offsets, math_dtype)
    args = (head_size, rope_dim_offset, shape.rot_dim)
    heads = sum(x.numel() for x in tensors) // (shape.num_tokens * head_size)
    block = max(1, _BLOCK_BYTES // (4 * shape.rot_dim * heads))
    # Blocks are a CPU cache matter; on a GPU they would only multiply kernel launches.
    if shape.num_tokens <= block or not positions.is_cpu:
        for x in tensors:
            _rotate_(x, *args, cos, sin, neg_sin, is_neox)
        return
    for idx in _token_blocks(positions.shape, block):
        for x in tensors:
            _rotate_(x[idx], *args, cos[idx], sin[idx], neg_sin[idx], is_neox)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    rope_dim_offset: int = 0,
    inverse: bool = False,
    cache_offsets: Optional[torch.Tensor] = None,
    *,
    allow_float64: bool = False,
) -> None:
    """Rotate `query` and `key` in place (vLLM semantics; `cache_offsets` adds per-token rows).

    `allow_float64` (the differentiable op's float64 path, for gradient checks) also takes
    float64 query and key, rotated in float64 math; the op itself takes float32/16/bf16.

    Refuses (RuntimeError) a query or key that requires grad while grad mode is on: the
    rotation is not recorded by autograd (checks.GRAD_MESSAGE names the differentiable path).
    """
    head_size, rope_dim_offset = check_rotary_types(
        positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse
    )
    if cache_offsets is not None:
        check_tensor("cos_sin_cache_offsets", cache_offsets)
    # Bounds are checked by the gather in _gather_cos_sin, at no extra cost.
    shape = check_rotary_args(
        positions, query, key, head_size, cos_sin_cache, rope_dim_offset, cache_offsets, allow_float64
    )
    check_no_grad(query, key)
    tensors = tuple(x for x in (query, key) if x is not None and x.numel() > 0)
    if not tensors:  # no tokens, or no heads
        return
    _rotate_tokens(
        positions, tensors, head_size, cos_sin_cache, bool(is_neox), rope_dim_offset, bool(inverse),
        cache_offsets, shape,
    )
