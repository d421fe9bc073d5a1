"""The compiled CUDA kernel as the CUDA implementation of the registered ops.

The extension's `launch` functions check the arguments, raise Python exceptions for bad ones
(the same types and messages as ops/checks.py), and launch the kernel on the current stream.
"""

from __future__ import annotations

from types import ModuleType

import torch


def register(lib: torch.library.Library, module: ModuleType) -> None:
    """Register `module`'s kernels for the CUDA key of the ops defined in `lib`."""
    # The dispatcher passes every schema argument, defaults included, so the C functions
    # can be the kernels themselves: no Python frame between the dispatcher and the launch.
    lib.impl("rotary_embedding", module.launch, "CUDA")
    lib.impl("batched_rotary_embedding", module.batched_launch, "CUDA")
    if hasattr(module, "set_kv_launch"):
        lib.impl("rotary_embedding_set_kv", module.set_kv_launch, "CUDA")
    if hasattr(module, "mrope_launch"):
        lib.impl("mrope_rotary_embedding", module.mrope_launch, "CUDA")
    if hasattr(module, "mrope_set_kv_launch"):
        lib.impl("mrope_rotary_embedding_set_kv", module.mrope_set_kv_launch, "CUDA")
