"""A stand-in `vllm._custom_ops` with the rotary ops only, for processes without vLLM.

After `install_vllm_alias()`, `from vllm import _custom_ops` and `import vllm._custom_ops`
give a module whose `rotary_embedding` and `batched_rotary_embedding` are rope-compat's.
Any other attribute of `vllm` or `vllm._custom_ops` raises AttributeError saying so, and
any other submodule (`import vllm.distributed`) raises ModuleNotFoundError, as it would
without vLLM, so code that probes optional vLLM features falls back as before.

Effect on discovery: the two modules sit in `sys.modules` with a `ModuleSpec` whose origin
is `ALIAS_ORIGIN`, so `importlib.util.find_spec("vllm")` (and `"vllm._custom_ops"`) returns
that spec instead of None: a check `find_spec("vllm") is not None` reports vLLM as present,
and `spec.origin == ALIAS_ORIGIN` tells the alias apart. `importlib.metadata.version("vllm")`
still raises PackageNotFoundError. `uninstall_vllm_alias()` removes both modules; names
that code bound from them meanwhile keep working.

The alias never shadows a real vLLM: where one is importable it is not installed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
import types
import warnings

from .. import api

ALIAS_ORIGIN = "rope-compat alias"
OPS = ("rotary_embedding", "batched_rotary_embedding")

_lock = threading.Lock()


class _AliasModule(types.ModuleType):
    def __getattr__(self, name: str):
        raise AttributeError(
            f"module {self.__name__!r} is rope-compat's stand-in for vLLM, which provides only "
            f"vllm._custom_ops.{' and vllm._custom_ops.'.join(OPS)}; {name!r} is not available"
        )


def _alias_module(name: str) -> _AliasModule:
    module = _AliasModule(name, f"rope-compat's stand-in for {name}: the rotary ops only.")
    is_package = name == "vllm"
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=ALIAS_ORIGIN, is_package=is_package)
    module.__loader__ = None
    if is_package:
        module.__path__ = []  # a package with no submodules: other imports fail as usual
    return module


def alias_installed() -> bool:
    """Whether `sys.modules["vllm"]` is rope-compat's alias."""
    return isinstance(sys.modules.get("vllm"), _AliasModule)


def install_vllm_alias() -> bool:
    """Provide `vllm._custom_ops.rotary_embedding` / `batched_rotary_embedding` where vLLM is absent.

    Returns True when the alias is in place (also when it already was). Where a real vLLM is
    imported or importable it does nothing but warn (RuntimeWarning) and returns False: use
    `patch_vllm()` to route a real vLLM through rope-compat.
    """
    with _lock:
        if alias_installed():
            return True
        real = sys.modules.get("vllm")
        spec = real.__spec__ if real is not None else importlib.util.find_spec("vllm")
        if real is not None or spec is not None:
            where = getattr(spec, "origin", None) or "sys.modules"
            warnings.warn(
                f"rope-compat: a real vLLM is installed ({where}); the vllm alias is not "
                "installed (use rope_compat.patch_vllm() to route vLLM's op through rope-compat)",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        package, ops = _alias_module("vllm"), _alias_module("vllm._custom_ops")
        for name in OPS:
            setattr(ops, name, getattr(api, name))
        package._custom_ops = ops
        sys.modules["vllm._custom_ops"] = ops
        sys.modules["vllm"] = package
        return True


def uninstall_vllm_alias() -> bool:
    """Remove the alias modules from `sys.modules`; returns whether they were installed."""
    with _lock:
        if not alias_installed():
            return False
        for name in ("vllm._custom_ops", "vllm"):
            if isinstance(sys.modules.get(name), _AliasModule):
                del sys.modules[name]
        return True
