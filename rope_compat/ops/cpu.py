"""The compiled CPU kernel (rope_compat._cpu, csrc/cpu_ops.cpp) as the CPU implementation of the ops.

Like the CUDA module's, its `launch` functions check the arguments, raise Python exceptions
for bad ones (the same types and messages as ops/checks.py, out-of-range positions included)
and rotate in place.
"""

from __future__ import annotations

from types import ModuleType

import torch

# at::vec instruction sets, from least to most capable: a module built for one runs on a CPU
# for which torch reports it or a more capable one.
_CAPABILITY_RANK = {"DEFAULT": 0, "AVX2": 1, "AVX512": 2, "AVX512_BF16": 3}


def unsupported_reason(module: ModuleType) -> str | None:
    """Why `module` cannot run on this CPU, or None when it can."""
    built = getattr(module, "cpu_capability", "DEFAULT").upper()
    if built == "DEFAULT":
        return None
    here = torch.backends.cpu.get_cpu_capability().upper()
    if here.startswith("AVX512"):
        here = "AVX512_BF16" if torch.cpu._is_avx512_bf16_supported() else "AVX512"
    if _CAPABILITY_RANK.get(here, 0) < _CAPABILITY_RANK.get(built, 4):
        return f"built for {built}, but torch reports {here} for this CPU"
    return None


def register(lib: torch.library.Library, module: ModuleType) -> None:
    """Register `module`'s kernels for the CPU key of the ops defined in `lib`."""
    lib.impl("rotary_embedding", module.launch, "CPU")
    lib.impl("batched_rotary_embedding", module.batched_launch, "CPU")
    if hasattr(module, "set_kv_launch"):
        lib.impl("rotary_embedding_set_kv", module.set_kv_launch, "CPU")
