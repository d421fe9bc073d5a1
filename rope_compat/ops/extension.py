"""Loading the compiled extensions (csrc/): the CUDA kernel (rope_compat._C) and the CPU kernel
(rope_compat._cpu), each registered for its dispatch key of the ops."""

from __future__ import annotations

import glob
import importlib
import logging
import os
from typing import Any, Optional

import torch

logger = logging.getLogger("rope_compat")

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_state: dict = {"path": None, "error": None, "module": None}
_cpu_state: dict = {"path": None, "error": None, "module": None}


def library_path() -> Optional[str]:
    """Path of the built CUDA extension inside the package, if there is one."""
    found = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_C*.so")))
    return found[0] if found else None


def cpu_library_path() -> Optional[str]:
    """Path of the built CPU extension inside the package, if there is one."""
    found = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_cpu*.so")))
    return found[0] if found else None


def load() -> None:
    """Load both extensions once; on any failure keep the Torch implementation and say why."""
    _load_cpu()
    _load_cuda()


def _env_set(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0")


def _load_cpu() -> None:
    # ROPE_COMPAT_DISABLE_KERNEL disables both kernels; ..._CPU_KERNEL the CPU one only.
    if _env_set("ROPE_COMPAT_DISABLE_KERNEL") or _env_set("ROPE_COMPAT_DISABLE_CPU_KERNEL"):
        var = "ROPE_COMPAT_DISABLE_KERNEL" if _env_set("ROPE_COMPAT_DISABLE_KERNEL") else "ROPE_COMPAT_DISABLE_CPU_KERNEL"
        _cpu_state["error"] = f"disabled by {var}"
    elif (path := cpu_library_path()) is None:
        _cpu_state["error"] = "not built"
    else:
        try:
            module = importlib.import_module("rope_compat._cpu")
            from . import cpu
            from .library import lib

            reason = cpu.unsupported_reason(module)
            if reason is not None:
                _cpu_state["error"] = f"not loaded: {reason}"
            else:
                cpu.register(lib, module)
                _cpu_state["module"] = module
                _cpu_state["path"] = path
        except ImportError as e:  # e.g. built for another torch
            _cpu_state["error"] = f"failed to load {os.path.basename(path)}: {e}"
    if has_cpu_kernel():
        logger.info("rope_compat: CPU kernel loaded from %s", _cpu_state["path"])
    else:
        logger.info("rope_compat: no CPU kernel (%s); using the Torch implementation", _cpu_state["error"])


def _load_cuda() -> None:
    if _env_set("ROPE_COMPAT_DISABLE_KERNEL"):
        _state["error"] = "disabled by ROPE_COMPAT_DISABLE_KERNEL"
    elif (path := library_path()) is None:
        _state["error"] = "not built (pure-Python install)"
    else:
        try:
            module = importlib.import_module("rope_compat._C")
            from . import cuda
            from .library import lib

            cuda.register(lib, module)
            _state["module"] = module
            _state["path"] = path
        except ImportError as e:  # e.g. built for another torch, or a CPU-only torch
            _state["error"] = f"failed to load {os.path.basename(path)}: {e}"
    if has_cuda_kernel():
        logger.info("rope_compat: CUDA kernel loaded from %s", _state["path"])
    else:
        logger.info("rope_compat: no CUDA kernel (%s); using the Torch implementation", _state["error"])


def has_cuda_kernel() -> bool:
    """Whether a compiled kernel is registered for CUDA tensors."""
    return _state["path"] is not None and torch._C._dispatch_has_kernel_for_dispatch_key(
        "rope_compat::rotary_embedding", "CUDA"
    )


def has_cpu_kernel() -> bool:
    """Whether the compiled CPU kernel is registered for CPU tensors."""
    return _cpu_state["module"] is not None


def cpu_binding() -> Optional[Any]:
    """The CPU extension module, whose `launch` rotates without the dispatcher (None if not loaded)."""
    return _cpu_state["module"]


def cpu_load_error() -> Optional[str]:
    return _cpu_state["error"]


def cpu_capability() -> Optional[str]:
    """The instruction set the loaded CPU kernel was compiled for."""
    module = _cpu_state["module"]
    return None if module is None else module.cpu_capability


def direct_binding() -> Optional[Any]:
    """The extension module, whose functions launch the kernel without the dispatcher."""
    return _state["module"]


def load_error() -> Optional[str]:
    return _state["error"]


def backend_for(device: torch.device | str) -> str:
    """Which implementation serves tensors on `device`: 'cuda-kernel', 'cpu-kernel' or 'torch'."""
    kind = torch.device(device).type
    if kind == "cuda" and has_cuda_kernel():
        return "cuda-kernel"
    if kind == "cpu" and has_cpu_kernel():
        return "cpu-kernel"
    return "torch"
