"""A stand-in `sgl_kernel` with its rope names only, for processes without sgl-kernel.

After `install_sgl_kernel_alias()`, `import sgl_kernel` gives a module with
`apply_rope_with_cos_sin_cache_inplace` (sgl-kernel's signature, `fused_set_kv_buffer_arg`
and `enable_pdl` included), `rotary_embedding` and `FusedSetKVBufferArg`, all rope-compat's.
Any other attribute raises `SglKernelAliasError`, an ImportError that names what the alias
provides: `from sgl_kernel import silu_and_mul` fails as it would without sgl-kernel, so
code with `try: ... except ImportError:` fallbacks keeps taking them. (An AttributeError
would be turned into a bare ImportError by `from ... import` and lose the explanation;
dunder names still raise AttributeError, so `hasattr(m, "__file__")` and friends work.)
Submodules (`import sgl_kernel.flash_attn`) raise ModuleNotFoundError. The module's spec
has origin `ALIAS_ORIGIN` ("rope-compat alias").

The alias never shadows a real sgl-kernel: where one is importable it is not installed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
import types

from .. import api
from .alias import ALIAS_ORIGIN
from .sgl import FusedSetKVBufferArg

NAME = "sgl_kernel"
PROVIDES = ("apply_rope_with_cos_sin_cache_inplace", "rotary_embedding", "FusedSetKVBufferArg")

_lock = threading.Lock()


class SglKernelAliasError(ImportError):
    """An attribute rope-compat's sgl_kernel alias does not provide."""


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox=True) -> None:
    """sgl-kernel's `rotary_embedding`: vLLM's op, in place (`is_neox` defaults to True)."""
    api.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


class _AliasModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        raise SglKernelAliasError(
            f"sgl_kernel is rope-compat's stand-in for sgl-kernel (not installed), which "
            f"provides only {', '.join(PROVIDES)}; {name!r} is not available",
            name=NAME,
        )


def alias_installed() -> bool:
    """Whether `sys.modules["sgl_kernel"]` is rope-compat's alias."""
    return isinstance(sys.modules.get(NAME), _AliasModule)


def _real_sgl_kernel_found() -> bool:
    real = sys.modules.get(NAME)
    if real is not None:
        return True
    try:
        return importlib.util.find_spec(NAME) is not None
    except (ImportError, ValueError):
        return False


def install_sgl_kernel_alias() -> bool:
    """Provide `sgl_kernel` with rope-compat's rope names where sgl-kernel is absent.

    Returns True when the alias is in place (also when it already was), False (and changes
    nothing) where a real sgl-kernel is imported or importable.
    """
    with _lock:
        if alias_installed():
            return True
        if _real_sgl_kernel_found():
            return False
        module = _AliasModule(NAME, "rope-compat's stand-in for sgl_kernel: the rope names only.")
        module.__spec__ = importlib.machinery.ModuleSpec(NAME, None, origin=ALIAS_ORIGIN, is_package=True)
        module.__loader__ = None
        module.__path__ = []
        module.apply_rope_with_cos_sin_cache_inplace = api.apply_rope_with_cos_sin_cache_inplace
        module.rotary_embedding = rotary_embedding
        module.FusedSetKVBufferArg = FusedSetKVBufferArg
        sys.modules[NAME] = module
        return True


def uninstall_sgl_kernel_alias() -> bool:
    """Remove the alias from `sys.modules`; returns whether it was installed."""
    with _lock:
        if not alias_installed():
            return False
        del sys.modules[NAME]
        return True
