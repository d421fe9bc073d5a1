"""`patch_status()`: what the compat layer has changed in this process.

It reads the patches' state (`_state`) and the aliases; it imports neither patch module, so
the compat layer has no import cycle (the patch modules import this one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from . import _state as state
from . import alias, sgl_kernel_alias, startup
from ._bindings import module_bindings


@dataclass(frozen=True)
class PatchStatus:
    """functions: vLLM function name -> module globals now bound to rope-compat's function.
    dispatch_keys: keys of vLLM's `_C::rotary_embedding` served by rope-compat.
    vllm_schema: that op's schema, as checked when it was patched.
    alias: whether `vllm` is rope-compat's alias.
    pending: the start-up routes still waiting for their target module to be imported.
    sglang: SGLang name patched ("module.name") -> module globals now bound to rope-compat's.
    sgl_kernel_alias: whether `sgl_kernel` is rope-compat's alias."""

    functions: Dict[str, List[str]]
    dispatch_keys: Tuple[str, ...]
    vllm_schema: Optional[str]
    alias: bool
    pending: Tuple[str, ...]
    sglang: Dict[str, List[str]]
    sgl_kernel_alias: bool

    @property
    def patched(self) -> bool:
        return bool(self.functions or self.dispatch_keys or self.sglang)


def bound_names(functions: Dict[str, Tuple[Callable, Callable]]) -> Dict[str, List[str]]:
    """Name -> the module globals now bound to its replacement."""
    with state.lock:
        return {
            name: [f"{mod}.{attr}" for mod, _, attr in module_bindings(replacement)]
            for name, (_, replacement) in functions.items()
        }


def patch_status() -> PatchStatus:
    with state.lock:
        return PatchStatus(
            functions=bound_names(state.vllm.functions),
            dispatch_keys=state.vllm.dispatch_keys,
            vllm_schema=state.vllm.schema,
            alias=alias.alias_installed(),
            pending=startup.pending_routes(),
            sglang=bound_names(state.sglang.functions),
            sgl_kernel_alias=sgl_kernel_alias.alias_installed(),
        )
