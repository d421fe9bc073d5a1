"""The plain float64 RoPE that every example checks its results against.

Written from the definition and independent of rope-compat's math (no cache, no rope-compat
code but its tolerance table, the one its tests use):
token t at position p rotates pair k of the first `2 * len(freqs)` dims of each head by the
angle `p * freqs[k]`, computed in float64. NeoX style pairs dims (k, k + r/2), GPT-J style
pairs (2k, 2k + 1).
"""

from __future__ import annotations

import torch

# (rtol, atol) by result dtype, one ulp of it: rope-compat's own table, shared with its tests.
from rope_compat.tolerances import rtol_atol


def default_freqs(rotary_dim: int, theta: float) -> torch.Tensor:
    """RoFormer's frequencies `theta ** (-2k / rotary_dim)`, float64."""
    return theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def rope64(
    x: torch.Tensor, positions: torch.Tensor, head_size: int, freqs: torch.Tensor, is_neox: bool,
    scale: float = 1.0,
) -> torch.Tensor:
    """`x` (`[tokens, heads * head_size]` or `[tokens, heads, head_size]`) rotated, as float64.

    `scale` multiplies cos and sin (YaRN-style magnitude scaling); 1 for plain RoPE.
    """
    half = freqs.numel()
    angles = positions.reshape(-1, 1).double() * freqs.double()  # [tokens, half]
    cos, sin = (angles.cos() * scale).unsqueeze(1), (angles.sin() * scale).unsqueeze(1)
    y = x.double().reshape(positions.numel(), -1, head_size).clone()
    k = torch.arange(half)
    first, second = (k, k + half) if is_neox else (2 * k, 2 * k + 1)
    a, b = y[..., first], y[..., second]
    y[..., first], y[..., second] = a * cos - b * sin, b * cos + a * sin
    return y.reshape(x.shape)


def check(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Raise AssertionError unless `actual` is within one ulp of its dtype of `expected`."""
    rtol, atol = rtol_atol(actual.dtype)
    err = (actual.double() - expected).abs()
    worst = (err / (atol + rtol * expected.abs())).max().item()
    if not worst <= 1.0:
        raise AssertionError(f"{name}: off by {err.max().item():.3g} (max err/tol {worst:.2f})")
