"""RoPE in plain tensor ops, the function the benchmark hands to torch.compile.

It is what a model's own Torch code does (gather cos/sin, rotate halves or neighbours, write
back), with no host-side checks or loops, so the compiler sees one static graph. The package's
Torch implementation is tuned for eager CPU use instead, and is not meant for compiling.
"""

from __future__ import annotations

from typing import Optional

import torch


def torch_rope(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool,
) -> None:
    """Rotate dims [0, rot_dim) of every head of `query` and `key` ([T, H * head_size]) in place."""
    cos, sin = cos_sin_cache.index_select(0, positions.view(-1)).float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [T, 1, rot_dim / 2]: broadcast over heads
    rot_dim = cos_sin_cache.shape[-1]
    for x in (query, key):
        if x is None:
            continue
        part = x.view(x.shape[0], -1, head_size)[..., :rot_dim]
        xf = part.float()
        if is_neox:
            x1, x2 = xf.chunk(2, dim=-1)
        else:
            x1, x2 = xf[..., 0::2], xf[..., 1::2]
        o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        out = torch.cat((o1, o2), dim=-1) if is_neox else torch.stack((o1, o2), dim=-1).flatten(-2)
        part.copy_(out)
