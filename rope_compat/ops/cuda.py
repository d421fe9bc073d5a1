"""The compiled CUDA kernel as the CUDA implementation of the registered ops.

The extension's functions return None, or `(exception name, message)` for a bad argument;
`raise_failure` raises that exception here, in Python (see csrc/ops.cpp for why errors are
not C++ exceptions).
"""

from __future__ import annotations

from types import ModuleType
from typing import Optional, Tuple

import torch

_EXCEPTIONS = {"ValueError": ValueError, "TypeError": TypeError, "RuntimeError": RuntimeError}


def raise_failure(failure: Tuple[str, str]) -> None:
    kind, message = failure
    raise _EXCEPTIONS.get(kind, RuntimeError)(message)


def register(lib: torch.library.Library, module: ModuleType) -> None:
    """Register `module`'s kernels for the CUDA key of the ops defined in `lib`."""

    def rotary_embedding(
        positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor], head_size: int,
        cos_sin_cache: torch.Tensor, is_neox: bool, rope_dim_offset: int = 0, inverse: bool = False,
    ) -> None:
        failure = module.rotary_embedding(
            positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse
        )
        if failure is not None:
            raise_failure(failure)

    def batched_rotary_embedding(
        positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor], head_size: int,
        cos_sin_cache: torch.Tensor, is_neox: bool, rot_dim: int, cos_sin_cache_offsets: torch.Tensor,
    ) -> None:
        failure = module.batched_rotary_embedding(
            positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim, cos_sin_cache_offsets
        )
        if failure is not None:
            raise_failure(failure)

    lib.impl("rotary_embedding", rotary_embedding, "CUDA")
    lib.impl("batched_rotary_embedding", batched_rotary_embedding, "CUDA")
