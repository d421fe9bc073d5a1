"""Route a real vLLM's rotary ops through rope-compat, and back, exactly.

Two routes, each applied at most once, each undone by `unpatch_vllm()`:

- functions (`patch_vllm()`): `vllm._custom_ops.rotary_embedding` (and
  `batched_rotary_embedding`, in vLLM versions that have it) is rebound to rope-compat's
  function, and so is every module-level name that already holds the original function
  object (code that did `from vllm._custom_ops import rotary_embedding`). Unpatching puts
  the identical original objects back, also where modules imported the replacement later.
  Bindings outside module globals (class attributes, closures, default arguments) are not
  seen.
- dispatcher (`patch_vllm(dispatcher=True)`): rope-compat becomes the kernel of vLLM's own
  op `_C::rotary_embedding` for the dispatch keys where vLLM has one (CPU, CUDA). vLLM's
  Python functions stay as they are, so compiled graphs keep the op that vLLM's
  torch.compile passes match by name. The registration lives in a `torch.library.Library`;
  destroying it reactivates vLLM's kernel.

All of this is guarded by one lock, so concurrent calls apply or undo each route once.
"""

from __future__ import annotations

import contextlib
import importlib
import types
from typing import List, Optional, Sequence

import torch

from .. import api
from . import _state as state
from . import alias
from ._bindings import distinct_copy, rebind
from .status import PatchStatus, bound_names, patch_status

VLLM_OP = "_C::rotary_embedding"
# Keys on which vLLM registers a kernel for its op; rope-compat's op serves both.
DISPATCH_KEYS = ("CPU", "CUDA")

_lock = state.lock


class UnsupportedVllmError(RuntimeError):
    """vLLM is absent, is rope-compat's alias, or its op has a schema rope-compat does not know."""


_state = state.vllm


def _signature(schema: torch._C.FunctionSchema) -> List[tuple]:
    """What must match for a kernel to serve an op: argument names, types, mutation, defaults."""
    return [
        (a.name, str(a.type), a.alias_info is not None and a.alias_info.is_write, a.default_value)
        for a in schema.arguments
    ] + [str(r.type) for r in schema.returns]


def check_vllm_schema(schema: torch._C.FunctionSchema) -> None:
    """Accept vLLM's current op schema (that of `rope_compat::rotary_embedding`, so since
    vLLM added rope_dim_offset and inverse) and the older one without those two arguments.

    Current: `_C::rotary_embedding(Tensor positions, Tensor($0! -> ) query,
    Tensor($1! -> )? key, int head_size, Tensor cos_sin_cache, bool is_neox,
    int rope_dim_offset=0, bool inverse=False) -> ()`.
    """
    ours = _signature(torch.ops.rope_compat.rotary_embedding.default._schema)
    older = ours[:6] + ours[8:]
    if _signature(schema) not in (ours, older):
        raise UnsupportedVllmError(
            f"vLLM's op has the schema {schema}, which rope-compat does not know (it knows "
            f"{torch.ops.rope_compat.rotary_embedding.default._schema} and the same without "
            "rope_dim_offset and inverse); not patching it"
        )


def _import_vllm_ops() -> types.ModuleType:
    """`vllm._custom_ops`, imported (importing it is what loads vLLM's compiled ops)."""
    if alias.alias_installed():
        raise UnsupportedVllmError(
            "vllm is rope-compat's alias (install_vllm_alias), not a real vLLM: nothing to patch"
        )
    try:
        return importlib.import_module("vllm._custom_ops")
    except ModuleNotFoundError as e:
        if e.name not in ("vllm", "vllm._custom_ops"):
            raise  # vLLM is there but misses a dependency: say so, unchanged
        raise UnsupportedVllmError(
            "vLLM is not installed; use rope_compat directly, or install_vllm_alias() for code "
            "that imports vllm._custom_ops"
        ) from e


def _patch_functions() -> None:
    if _state.functions:
        return
    ops = _import_vllm_ops()
    replacements = {
        "rotary_embedding": api.rotary_embedding,
        "batched_rotary_embedding": api.batched_rotary_embedding,
    }
    for name, ours in replacements.items():
        original = getattr(ops, name, None)  # batched_* is gone from recent vLLM
        if original is None:
            continue
        replacement = distinct_copy(ours)
        rebind(original, replacement)
        _state.functions[name] = (original, replacement)


def _unpatch_functions() -> None:
    for original, replacement in _state.functions.values():
        rebind(replacement, original)
    _state.functions.clear()


def _patch_dispatcher(keys: Optional[Sequence[str]]) -> None:
    if _state.library is not None:
        return
    _import_vllm_ops()
    if not hasattr(torch.ops._C, "rotary_embedding"):
        raise UnsupportedVllmError(f"vLLM registers no {VLLM_OP} op: nothing to patch")
    schema = torch.ops._C.rotary_embedding.default._schema
    check_vllm_schema(schema)
    if keys is None:
        keys = [k for k in DISPATCH_KEYS if torch._C._dispatch_has_kernel_for_dispatch_key(VLLM_OP, k)]
    if not keys:
        raise UnsupportedVllmError(f"vLLM's {VLLM_OP} has no kernel for any of {DISPATCH_KEYS}")
    library = torch.library.Library("_C", "IMPL")
    try:
        for key in keys:
            # rope-compat's public function has the op's signature (defaults included, which
            # the dispatcher does not fill in for Python kernels) and calls rope-compat's
            # op, whose CUDA kernel is the compiled one where it is built.
            library.impl("rotary_embedding", api.rotary_embedding, key)
    except Exception:
        library._destroy()
        raise
    _state.library, _state.dispatch_keys, _state.schema = library, tuple(keys), str(schema)


def _unpatch_dispatcher() -> None:
    if _state.library is not None:
        # torch.library has no public way to drop one registration; _destroy() is what a
        # Library's finalizer calls, and it leaves the previous kernel (vLLM's) active.
        _state.library._destroy()
    _state.library, _state.dispatch_keys, _state.schema = None, (), None


def patch_vllm(dispatcher: bool = False, dispatch_keys: Optional[Sequence[str]] = None) -> PatchStatus:
    """Route vLLM's rotary op through rope-compat (see the module docstring for the routes).

    dispatcher: False rebinds vLLM's Python functions; True registers rope-compat as the
    kernel of vLLM's `_C::rotary_embedding` op, for `dispatch_keys` (default: those of CPU
    and CUDA where vLLM has a kernel). Calling it again for an applied route does nothing.
    Raises UnsupportedVllmError when there is no real vLLM or its op schema is unknown.
    """
    with _lock:
        if dispatcher:
            _patch_dispatcher(dispatch_keys)
        else:
            _patch_functions()
        return patch_status()


def unpatch_vllm() -> PatchStatus:
    """Undo both routes: the original function objects and vLLM's kernels are back."""
    with _lock:
        _unpatch_functions()
        _unpatch_dispatcher()
        return patch_status()


@contextlib.contextmanager
def vllm_patched(dispatcher: bool = False, dispatch_keys: Optional[Sequence[str]] = None):
    """`patch_vllm(...)` for the duration of a `with` block; a route that was already
    applied when the block started stays applied after it."""
    with _lock:
        applied_before = _state.library is not None if dispatcher else bool(_state.functions)
        status = patch_vllm(dispatcher, dispatch_keys)
    try:
        yield status
    finally:
        if not applied_before:
            with _lock:
                if dispatcher:
                    _unpatch_dispatcher()
                else:
                    _unpatch_functions()


def patched_functions():
    """Function name -> the module globals now bound to rope-compat's replacement."""
    return bound_names(_state.functions)


def dispatcher_state():
    """(dispatch keys served by rope-compat, vLLM's op schema) of the dispatcher route."""
    with _lock:
        return _state.dispatch_keys, _state.schema
