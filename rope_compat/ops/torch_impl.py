"""The Torch implementation of the rotary ops: the specification in code, and the fallback.

It serves every device that has no compiled kernel (the CPU included) and is what
`torch.compile` benchmarks compile. Math is float32 whatever the input dtypes, rounded once
to the tensor dtype, as vLLM's kernel does.

Each rotated pair (x, y) becomes (x*c - y*s, y*c + x*s). Written over a pair axis of size 2
(NeoX: the two halves of the rotary slice; GPT-J: adjacent elements) that is
`out = x * cos + flip(x) * [-s, +s]`, which needs only a handful of tensor ops: on the CPU,
where per-op overhead dominates small calls, that is what keeps this fallback fast.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .checks import check_rotary_args


def _gather_cos_sin(
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    inverse: bool,
    cache_offsets: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token cos and signed sin, shaped to broadcast over [*positions.shape, heads, pairs]."""
    rows = positions if cache_offsets is None else positions + cache_offsets.view(positions.shape)
    n = cos_sin_cache.shape[0]
    if rows.device.type != "cpu":
        # Bounds were not checked on the host (that would sync): rows outside the cache
        # read a clamped row and get the identity rotation, so the token is left as it was.
        valid = ((rows >= 0) & (rows < n)).unsqueeze(-1)
        cs = cos_sin_cache[rows.clamp(0, n - 1)].float()
        half = cs.shape[-1] // 2
        identity = torch.cat([torch.ones_like(cs[..., :half]), torch.zeros_like(cs[..., half:])], -1)
        cs = torch.where(valid, cs, identity)
    else:
        cs = cos_sin_cache[rows].float()
    cos, sin = cs.chunk(2, dim=-1)
    if inverse:
        sin = -sin
    pair_dim = -2 if is_neox else -1
    signed_sin = torch.stack((-sin, sin), dim=pair_dim)
    # [*P, half] -> [*P, 1 (heads), 1, half] for NeoX, [*P, 1, half, 1] for GPT-J.
    cos = cos.unsqueeze(-2 if is_neox else -1).unsqueeze(-3)
    return cos, signed_sin.unsqueeze(-3)


def _rotate_(
    x: torch.Tensor,
    token_dims: int,
    head_size: int,
    rope_dim_offset: int,
    rot_dim: int,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    is_neox: bool,
) -> None:
    heads = x if x.dim() == token_dims + 2 else x.unflatten(-1, (-1, head_size))
    part = heads[..., rope_dim_offset : rope_dim_offset + rot_dim]
    pair_dim = -2 if is_neox else -1
    pairs = part.unflatten(-1, (2, rot_dim // 2) if is_neox else (rot_dim // 2, 2))
    xf = pairs.float()
    # Few, in-place temporaries: on the CPU a fresh large buffer costs page faults.
    out = xf.flip(pair_dim).mul_(signed_sin).addcmul_(xf, cos)
    pairs.copy_(out)


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
) -> None:
    """Rotate `query` and `key` in place (vLLM semantics; `cache_offsets` adds per-token rows)."""
    shape = check_rotary_args(
        positions, query, key, head_size, cos_sin_cache, rope_dim_offset, cache_offsets
    )
    if shape.num_tokens == 0:
        return
    cos, signed_sin = _gather_cos_sin(positions, cos_sin_cache, is_neox, inverse, cache_offsets)
    for x in (query, key):
        if x is not None and x.numel() > 0:
            _rotate_(
                x, positions.dim(), head_size, rope_dim_offset, shape.rot_dim, cos, signed_sin, is_neox
            )
