"""Random inputs for the rotary op in every layout the op accepts.

Inputs are fresh random values (never zeros): positions span the whole cache, and q/k can be
views sliced out of one fused qkv tensor, the way engines call the op.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

LAYOUTS = ("flat", "heads", "fused_flat", "fused_heads")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bits of `t` on the CPU as integers of its width, for bit-exact comparisons of any
    dtype (float8 included; NaN payloads and signed zeros compare as themselves)."""
    t = t.detach().cpu().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@dataclass
class Case:
    positions: torch.Tensor
    query: torch.Tensor
    key: Optional[torch.Tensor]
    head_size: int
    cos_sin_cache: torch.Tensor
    is_neox: bool
    rope_dim_offset: int = 0
    inverse: bool = False

    def args(self) -> tuple:
        return (
            self.positions, self.query, self.key, self.head_size, self.cos_sin_cache,
            self.is_neox, self.rope_dim_offset, self.inverse,
        )


def random_cache(rows: int, rot_dim: int, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """A cache of real cos/sin rows (unit-circle values) at random angles."""
    angles = torch.rand(rows, rot_dim // 2, dtype=torch.float64) * 1000.0
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype=dtype, device=device)


def _qk(
    tokens: Tuple[int, ...], heads: int, kv_heads: int, head_size: int, layout: str,
    dtype: torch.dtype, device,
) -> Tuple[torch.Tensor, torch.Tensor]:
    q_width, k_width = heads * head_size, kv_heads * head_size
    if layout.startswith("fused"):
        # [*, q | k | v] plus a little padding, as a fused projection would produce.
        qkv = torch.randn(*tokens, q_width + 2 * k_width + 8, dtype=dtype, device=device)
        q, k = qkv[..., :q_width], qkv[..., q_width : q_width + k_width]
    else:
        q = torch.randn(*tokens, q_width, dtype=dtype, device=device)
        k = torch.randn(*tokens, k_width, dtype=dtype, device=device)
    if layout.endswith("heads"):
        q = q.unflatten(-1, (heads, head_size))
        k = k.unflatten(-1, (kv_heads, head_size))
    return q, k


def make_case(
    tokens: Tuple[int, ...] = (17,),
    heads: int = 4,
    kv_heads: int = 2,
    head_size: int = 64,
    rot_dim: Optional[int] = None,
    rope_dim_offset: int = 0,
    is_neox: bool = True,
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype = torch.float32,
    pos_dtype: torch.dtype = torch.int64,
    layout: str = "flat",
    with_key: bool = True,
    inverse: bool = False,
    cache_rows: int = 4096,
    device="cpu",
) -> Case:
    rot_dim = head_size if rot_dim is None else rot_dim
    positions = torch.randint(0, cache_rows, tokens, dtype=pos_dtype, device=device)
    q, k = _qk(tokens, heads, kv_heads, head_size, layout, dtype, device)
    cache = random_cache(cache_rows, rot_dim, cache_dtype, device)
    return Case(positions, q, k if with_key else None, head_size, cache, is_neox, rope_dim_offset, inverse)
