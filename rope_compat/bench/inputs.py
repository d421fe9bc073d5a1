"""Benchmark inputs laid out the way engines call RoPE.

q and k are strided views into one fused qkv projection output `[T, (Hq + 2*Hk) * D]`,
positions are random int64 over the whole cache (so cache rows are gathered, not streamed),
and the cache holds real RoPE angles. Several input sets can share one cache: cycling
through them keeps small problems from being served out of L2 by the previous call.
"""

from __future__ import annotations

import math
from typing import List, NamedTuple, Optional

import torch

from .shapes import Shape, bytes_to_move


class InputSet(NamedTuple):
    positions: torch.Tensor  # [T] int64
    qkv: torch.Tensor  # [T, (Hq + 2*Hk) * D]
    query: torch.Tensor  # view [T, Hq*D]
    key: torch.Tensor  # view [T, Hk*D]
    rotated: torch.Tensor  # view [T, Hq+Hk, rot_dim]: exactly the q/k elements that rotate


class Inputs(NamedTuple):
    shape: Shape
    tokens: int
    sets: List[InputSet]
    cos_sin_cache: torch.Tensor  # [rows, rot_dim]


def rope_cache(rows: int, rot_dim: int, dtype: torch.dtype, device, base: float = 500000.0) -> torch.Tensor:
    """Rows `[cos | sin]` of position * inverse frequency, as a Llama-3-style model builds them."""
    inv_freq = base ** (-torch.arange(0, rot_dim, 2, dtype=torch.float64, device=device) / rot_dim)
    angles = torch.outer(torch.arange(rows, dtype=torch.float64, device=device), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)


def sets_needed(shape: Shape, tokens: int, dtype: torch.dtype, cache_dtype: torch.dtype,
                spill_bytes: int, max_sets: Optional[int] = None) -> int:
    """Input sets whose bytes together exceed `spill_bytes` (e.g. twice L2); `max_sets` caps
    their count (None: no cap, so even one-token calls cannot find their inputs in L2)."""
    per_set = bytes_to_move(shape, tokens, dtype, cache_dtype)
    n = math.floor(spill_bytes / per_set) + 1
    return max(1, n if max_sets is None else min(max_sets, n))


def make_inputs(
    shape: Shape, tokens: int, n_sets: int, cos_sin_cache: torch.Tensor, dtype: torch.dtype,
    generator: torch.Generator,
) -> Inputs:
    device = cos_sin_cache.device
    hq, hk, d = shape.heads, shape.kv_heads, shape.head_size
    sets = []
    for _ in range(n_sets):
        positions = torch.randint(
            0, cos_sin_cache.shape[0], (tokens,), generator=generator, dtype=torch.int64
        ).to(device)
        qkv = torch.randn(tokens, (hq + 2 * hk) * d, dtype=dtype, device=device)
        query, key = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d]
        rotated = qkv[:, : (hq + hk) * d].unflatten(-1, (hq + hk, d))[..., : shape.rot_dim]
        sets.append(InputSet(positions, qkv, query, key, rotated))
    return Inputs(shape, tokens, sets, cos_sin_cache)
