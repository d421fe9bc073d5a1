"""Multimodal RoPE (Qwen2-VL, arXiv:2409.12191) as per-token cos/sin rows for the ordinary op.

A helper for callers that want the gathered rows; `MRotaryEmbedding` no longer uses it: it
calls `rope_compat.mrope_rotary_embedding` (ops/mrope.py), which picks the rows in the kernel.

MRoPE gives each token three positions (temporal, height, width) and splits the rotary
frequencies into three sections, each driven by one of them. For a token, frequency `c` of
the cos/sin row therefore comes from the cache row of position `positions[s(c), t]`, where
`s(c)` is the section of `c`. Gathering those entries gives one ordinary `[cos | sin]` row
per token, and the op then rotates with positions `0..T-1` over that per-token table.

Section layouts: contiguous (Qwen2-VL, Qwen2.5-VL: `[t]*s0 + [h]*s1 + [w]*s2`) and
interleaved (Qwen3-VL: `t h w t h w ...` for the first `3 * s1` / `3 * s2` frequencies,
temporal for the rest).
"""

from __future__ import annotations

from typing import Sequence

import torch


def mrope_section_index(
    mrope_section: Sequence[int], rotary_dim: int, interleaved: bool = False
) -> torch.Tensor:
    """int64 `[rotary_dim // 2]`: which of the t/h/w positions (0/1/2) drives each frequency."""
    half = rotary_dim // 2
    if len(mrope_section) != 3 or sum(mrope_section) != half:
        raise ValueError(
            f"mrope_section: expected 3 sections summing to rotary_dim / 2 = {half}, got {list(mrope_section)}"
        )
    if not interleaved:
        return torch.repeat_interleave(torch.arange(3), torch.tensor(list(mrope_section)))
    c = torch.arange(half)
    index = torch.zeros(half, dtype=torch.int64)
    index[(c % 3 == 1) & (c < 3 * mrope_section[1])] = 1
    index[(c % 3 == 2) & (c < 3 * mrope_section[2])] = 2
    return index


def mrope_cos_sin_rows(
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    mrope_section: Sequence[int],
    interleaved: bool = False,
) -> torch.Tensor:
    """Per-token cos/sin rows `[T, rot_dim]` for t/h/w positions `[3, T]`.

    Row t, column c (and its sine column c + rot_dim/2) is
    `cos_sin_cache[positions[s(c), t], c]`. Rotating token t with this row (position t of
    the returned table) is exactly MRoPE.
    """
    if positions.dim() != 2 or positions.shape[0] != 3:
        raise ValueError(f"positions: expected shape [3, num_tokens] for MRoPE, got {tuple(positions.shape)}")
    rot_dim = cos_sin_cache.shape[1]
    section = mrope_section_index(mrope_section, rot_dim, interleaved).to(positions.device)
    columns = torch.cat([section, section])  # the sine half uses the same position as its cosine
    rows = positions.long().t()[:, columns]  # [T, rot_dim], contiguous: the cache row of each entry
    return cos_sin_cache[rows, torch.arange(rot_dim, device=positions.device)]
