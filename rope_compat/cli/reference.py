"""A float64 reference for the rotary op, used by `rope-compat verify`.

Written as complex multiplication, a formulation independent of the Torch implementation's:
each rotated pair (x, y) is the complex number x + iy, a cache row gives e^{i·theta} =
cos + i·sin, and the rotation is their product. Inputs are never modified.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch


def _rotate(
    x: torch.Tensor, token_dims: int, head_size: int, phase: torch.Tensor,
    rope_dim_offset: int, is_neox: bool,
) -> torch.Tensor:
    rot_dim = 2 * phase.shape[-1]
    heads = x.double().cpu().reshape(*x.shape[:token_dims], -1, head_size).clone()
    part = heads[..., rope_dim_offset : rope_dim_offset + rot_dim]
    if is_neox:  # pair i is (i, i + rot_dim/2)
        z = torch.complex(part[..., : rot_dim // 2], part[..., rot_dim // 2 :])
    else:  # pair i is (2i, 2i + 1)
        z = torch.complex(part[..., 0::2], part[..., 1::2])
    z = z * phase.unsqueeze(-2)  # broadcast over heads
    if is_neox:
        part[..., : rot_dim // 2], part[..., rot_dim // 2 :] = z.real, z.imag
    else:
        part[..., 0::2], part[..., 1::2] = z.real, z.imag
    return heads.reshape(x.shape)


def rope_reference(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    rope_dim_offset: int = 0,
    inverse: bool = False,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Rotated float64 copies of query and key (on the CPU), in the inputs' shapes."""
    rows = cos_sin_cache.double().cpu()[positions.long().cpu()]  # [*positions.shape, rot_dim]
    cos, sin = rows.chunk(2, dim=-1)
    phase = torch.complex(cos, -sin if inverse else sin)
    d = positions.dim()
    q = _rotate(query, d, head_size, phase, rope_dim_offset, is_neox)
    k = None if key is None else _rotate(key, d, head_size, phase, rope_dim_offset, is_neox)
    return q, k
