"""Other libraries' RoPE kernels, called the way they are meant to be called.

Each `External` knows how to import its kernel (only when asked: these imports are heavy)
and which calls it supports, so `verify` and `bench` never feed it inputs it would reject,
crash on, or silently get wrong (vLLM's CPU kernel, for one, misreads [T, H, D] tensors).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch

# (positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse), in place
RotaryFn = Callable[..., None]


class CallInfo(NamedTuple):
    """What a call looks like, as far as the libraries' limitations go."""

    device: str  # "cpu" or "cuda"
    flat: bool  # q/k given as [..., heads * head_size] (else [..., heads, head_size])
    dtype: torch.dtype
    cache_dtype: torch.dtype
    rot_dim: int
    is_neox: bool
    rope_dim_offset: int
    inverse: bool
    positions_1d: bool
    has_key: bool


@dataclass(frozen=True)
class External:
    name: str
    module: str  # the importable top-level module that marks the library as installed
    cache_dtype: Callable[[torch.dtype], torch.dtype]  # q dtype -> the cache dtype it takes
    limits: Callable[[CallInfo], Optional[str]]  # why a call is unsupported, or None
    _load: Callable[[], RotaryFn]

    def installed(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            return False

    def unsupported(self, call: CallInfo) -> Optional[str]:
        """None if the library handles this call, else the reason it is skipped."""
        if call.cache_dtype != self.cache_dtype(call.dtype):
            return f"takes a {self.cache_dtype(call.dtype)} cache"
        return self.limits(call)

    def load(self) -> RotaryFn:
        """Import the kernel; raises ImportError (or the library's own error) if it cannot."""
        return self._load()


def _load_vllm() -> RotaryFn:
    ops = importlib.import_module("vllm._custom_ops")

    def call(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0, inverse=False):
        # vLLM's kernel reads int64 positions; .long() is free for int64 tensors.
        ops.rotary_embedding(
            positions.long(), query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse
        )

    return call


def _vllm_limits(c: CallInfo) -> Optional[str]:
    if c.device == "cpu":
        if not c.flat:
            return "CPU kernel reads [T, H*D] layouts only"
        if c.dtype == torch.bfloat16 and c.is_neox and (c.rot_dim // 2) % 8 != 0:
            return "CPU kernel crashes for bf16 NeoX with rot_dim/2 not a multiple of 8"
        if c.rope_dim_offset or c.inverse:
            return "CPU kernel has no rope_dim_offset/inverse"
    return None


def _flashinfer_style_limits(c: CallInfo) -> Optional[str]:
    if c.device != "cuda":
        return "CUDA only"
    if not (c.flat and c.positions_1d and c.has_key):
        return "takes [T, H*D] query and key with 1-D positions"
    if c.rope_dim_offset or c.inverse:
        return "no rope_dim_offset/inverse"
    return None


def _load_flashinfer() -> RotaryFn:
    rope = importlib.import_module("flashinfer.rope")

    def call(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0, inverse=False):
        rope.apply_rope_with_cos_sin_cache_inplace(
            positions.long(), query, key, head_size, cos_sin_cache, is_neox
        )

    return call


def _load_sgl_kernel() -> RotaryFn:
    sgl = importlib.import_module("sgl_kernel")

    def call(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0, inverse=False):
        sgl.apply_rope_with_cos_sin_cache_inplace(
            positions=positions.long(), query=query, key=key, head_size=head_size,
            cos_sin_cache=cos_sin_cache, is_neox=is_neox,
        )

    return call


EXTERNALS = (
    # vLLM's engines hand the op a cache in q's dtype.
    External("vllm", "vllm", lambda dtype: dtype, _vllm_limits, _load_vllm),
    External("flashinfer", "flashinfer", lambda dtype: torch.float32, _flashinfer_style_limits, _load_flashinfer),
    External("sgl-kernel", "sgl_kernel", lambda dtype: torch.float32, _flashinfer_style_limits, _load_sgl_kernel),
)


def installed_externals() -> list:
    return [e for e in EXTERNALS if e.installed()]
