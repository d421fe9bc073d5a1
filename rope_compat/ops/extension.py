"""Loading the compiled extension (csrc/), which registers the CUDA kernel of the ops."""

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


def library_path() -> Optional[str]:
    """Path of the built extension inside the package, if there is one."""
    found = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_C*.so")))
    return found[0] if found else None


def load() -> None:
    """Load the extension once; on any failure keep the Torch implementation and say why."""
    if os.environ.get("ROPE_COMPAT_DISABLE_KERNEL", "0") not in ("", "0"):
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


def direct_binding() -> Optional[Any]:
    """The extension module, whose functions launch the kernel without the dispatcher."""
    return _state["module"]


def load_error() -> Optional[str]:
    return _state["error"]


def backend_for(device: torch.device | str) -> str:
    """Which implementation serves tensors on `device`: 'cuda-kernel' or 'torch'."""
    return "cuda-kernel" if torch.device(device).type == "cuda" and has_cuda_kernel() else "torch"
