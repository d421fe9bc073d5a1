"""Benchmark shapes (attention geometries of real models), token counts, and the byte count.

Bytes that must move for one call, the yardstick of every figure the benchmark prints:

    2 * T * (Hq + Hk) * rot_dim * elem_size      rotated part of q and k, read and written once
  +     T * pos_size                             positions, read once
  +     T * rot_dim * cache_elem_size            one cache row [cos | sin] gathered per token

Pass-through dims (head_size - rot_dim per head) and the v part of qkv need not move at all.
"""

from __future__ import annotations

import re
from typing import Dict, List, NamedTuple

import torch


class Shape(NamedTuple):
    name: str
    heads: int  # query heads (Hq)
    kv_heads: int  # key heads (Hk)
    head_size: int
    rot_dim: int
    is_neox: bool

    @property
    def label(self) -> str:
        return (
            f"{self.heads}/{self.kv_heads}x{self.head_size} rot{self.rot_dim} "
            f"{'neox' if self.is_neox else 'gptj'}"
        )


MODEL_SHAPES: Dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("llama3-8b", 32, 8, 128, 128, True),
        Shape("llama3-70b-tp", 64, 8, 128, 128, True),  # a per-GPU shard of Llama-3-70B-like heads
        Shape("partial-rotary", 32, 32, 128, 64, True),  # half of each head rotates
        Shape("gptj", 16, 16, 256, 64, False),  # GPT-J: interleaved pairs, rot 64 of 256
    )
}

GPU_TOKENS = (1, 16, 128, 1024, 8192, 32768, 131072)
CPU_TOKENS = (1, 16, 256)
ALL_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)

_SPEC = re.compile(r"^(\d+)/(\d+)x(\d+)(?::(\d+))?(?::(neox|gptj))?$")


def parse_shape(text: str) -> Shape:
    """A model name (see MODEL_SHAPES) or 'Hq/HkxD[:rot_dim][:neox|gptj]', e.g. '4/2x64:32:gptj'."""
    if text in MODEL_SHAPES:
        return MODEL_SHAPES[text]
    m = _SPEC.match(text)
    if m is None:
        raise ValueError(
            f"shape {text!r}: expected one of {', '.join(MODEL_SHAPES)} or 'Hq/HkxD[:rot_dim][:neox|gptj]'"
        )
    hq, hk, d = int(m[1]), int(m[2]), int(m[3])
    rot = int(m[4]) if m[4] else d
    if rot > d or rot % 2 or hk == 0 or hq % hk:
        raise ValueError(f"shape {text!r}: need even rot_dim <= head_size and Hq a multiple of Hk")
    return Shape(text, hq, hk, d, rot, m[5] != "gptj")


def parse_tokens(text: str) -> List[int]:
    """'1,16,1024' or a range of powers of two '1-131072'; ValueError unless every count is >= 1."""
    try:
        if "-" in text:
            lo, hi = (int(v) for v in text.split("-"))
            tokens = [t for t in ALL_TOKENS if lo <= t <= hi]
        else:
            tokens = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"tokens {text!r}: expected counts like 1,16,1024 or a range like 1-131072") from None
    if not tokens:
        raise ValueError(f"tokens {text!r}: the range holds no power of two")
    if min(tokens) < 1:
        raise ValueError(f"tokens {text!r}: counts must be at least 1")
    return tokens


def bytes_to_move(
    shape: Shape, tokens: int, dtype: torch.dtype, cache_dtype: torch.dtype,
    pos_dtype: torch.dtype = torch.int64,
) -> int:
    """The bytes one call must read and write at least (formula in the module docstring)."""
    elem = torch.empty((), dtype=dtype).element_size()
    cache_elem = torch.empty((), dtype=cache_dtype).element_size()
    pos = torch.empty((), dtype=pos_dtype).element_size()
    qk = 2 * tokens * (shape.heads + shape.kv_heads) * shape.rot_dim * elem
    return qk + tokens * pos + tokens * shape.rot_dim * cache_elem
