"""RoPE variants: cos/sin cache builders, vLLM-style rotary modules and `get_rope`."""

from .cache import ROPE_TYPES, compute_cos_sin_cache
from .get_rope import get_rope
from .module import MRotaryEmbedding, RotaryEmbedding
from .mrope import mrope_cos_sin_rows

__all__ = [
    "ROPE_TYPES",
    "compute_cos_sin_cache",
    "get_rope",
    "RotaryEmbedding",
    "MRotaryEmbedding",
    "mrope_cos_sin_rows",
]
