"""Float64 reference for the rotary op, written independently of rope_compat's code.

It indexes the rotated pairs explicitly (no flip trick, no views into the input) and
returns new float64 tensors, so a bug in the implementation cannot hide in here too.
"""

from typing import Optional, Tuple

import torch


def rope_reference(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    rope_dim_offset: int = 0,
    inverse: bool = False,
    cache_offsets: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Rotated query and key in float64, with the same shapes as the inputs."""
    rows = positions.reshape(-1).long().cpu()
    if cache_offsets is not None:
        rows = rows + cache_offsets.reshape(-1).long().cpu()
    cache = cos_sin_cache.double().cpu()[rows]
    rot_dim = cache.shape[1]
    half = rot_dim // 2
    cos, sin = cache[:, :half], cache[:, half:]
    if inverse:
        sin = -sin
    i = torch.arange(half)
    first = rope_dim_offset + (i if is_neox else 2 * i)
    second = rope_dim_offset + (i + half if is_neox else 2 * i + 1)

    def apply(x: torch.Tensor) -> torch.Tensor:
        y = x.double().cpu().reshape(rows.numel(), -1, head_size).clone()
        a, b = y[:, :, first], y[:, :, second]
        y[:, :, first] = a * cos[:, None, :] - b * sin[:, None, :]
        y[:, :, second] = b * cos[:, None, :] + a * sin[:, None, :]
        return y.reshape(x.shape)

    return apply(query), (None if key is None else apply(key))


def mrope_pair_sections(mrope_section, half: int, interleaved: bool) -> list:
    """Section (0 temporal, 1 height, 2 width) of each rotated pair, as a plain list."""
    s0, s1, s2 = mrope_section
    out = []
    for i in range(half):
        if interleaved:
            out.append(1 if (i % 3 == 1 and i < 3 * s1) else 2 if (i % 3 == 2 and i < 3 * s2) else 0)
        else:
            out.append(0 if i < s0 else 1 if i < s0 + s1 else 2)
    return out


def mrope_reference(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    mrope_section,
    interleaved: bool,
    rope_dim_offset: int = 0,
    inverse: bool = False,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """MRoPE in float64: pair i of token t takes cache row positions[section(i), t]."""
    pos = positions.long().cpu()
    num_tokens = pos.shape[1]
    cache = cos_sin_cache.double().cpu()
    half = cache.shape[1] // 2
    sec = torch.tensor(mrope_pair_sections(mrope_section, half, interleaved), dtype=torch.long)
    i = torch.arange(half)
    rows = pos[sec][:, :]  # [half, T]: the row of pair i for token t
    cos = cache[rows, i[:, None]].t()  # [T, half]
    sin = cache[rows, half + i[:, None]].t()
    if inverse:
        sin = -sin
    first = rope_dim_offset + (i if is_neox else 2 * i)
    second = rope_dim_offset + (i + half if is_neox else 2 * i + 1)

    def apply(x: torch.Tensor) -> torch.Tensor:
        y = x.double().cpu().reshape(num_tokens, -1, head_size).clone()
        a, b = y[:, :, first], y[:, :, second]
        y[:, :, first] = a * cos[:, None, :] - b * sin[:, None, :]
        y[:, :, second] = b * cos[:, None, :] + a * sin[:, None, :]
        return y.reshape(x.shape)

    return apply(query), (None if key is None else apply(key))
