"""`patch_status()`: what the compat layer has changed in this process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from . import alias, startup, vllm_patch


@dataclass(frozen=True)
class PatchStatus:
    """functions: vLLM function name -> module globals now bound to rope-compat's function.
    dispatch_keys: keys of vLLM's `_C::rotary_embedding` served by rope-compat.
    vllm_schema: that op's schema, as checked when it was patched.
    alias: whether `vllm` is rope-compat's alias.
    pending: the route the start-up hook applies when `vllm._custom_ops` is imported."""

    functions: Dict[str, List[str]]
    dispatch_keys: Tuple[str, ...]
    vllm_schema: Optional[str]
    alias: bool
    pending: Optional[str]

    @property
    def patched(self) -> bool:
        return bool(self.functions or self.dispatch_keys)


def patch_status() -> PatchStatus:
    keys, schema = vllm_patch.dispatcher_state()
    return PatchStatus(
        functions=vllm_patch.patched_functions(),
        dispatch_keys=keys,
        vllm_schema=schema,
        alias=alias.alias_installed(),
        pending=startup.pending_route(),
    )
