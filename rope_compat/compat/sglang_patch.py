"""Route an installed SGLang's rope entry points through rope-compat, and back, exactly.

`patch_sglang()` imports SGLang's rope modules (`_rope_compat_startup.SGLANG_MODULES`: those
of the installed version are there, the others are skipped) and, in each, rebinds the names
`rope_compat.sglang` serves: the module attribute and every module global that holds the
same function object (code that did `from sglang.kernels.ops.attention.rope import
apply_rope_with_cos_sin_cache_inplace`, as SGLang's RotaryEmbedding does). Each name is first
checked against rope-compat's signature for it (parameter names, kinds and defaults); a
module whose function differs is refused as a whole with UnsupportedSglangError, before
anything is rebound. A module that still has sgl-kernel's signature for
`apply_rope_with_cos_sin_cache_inplace` (SGLang before its own rope kernel) gets
`rope_compat.apply_rope_with_cos_sin_cache_inplace`, which has it.

The replacements are distinct copies of rope-compat's functions (no extra call layer), so
`unpatch_sglang()` finds exactly the names bound to them, also in modules that imported the
replacement later, and puts the identical originals back. `FusedSetKVBufferArg` is not
rebound: SGLang's own instances (4 fields) are accepted as they are.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .. import api
from .. import sglang as ours
from . import _state as state
from ._bindings import distinct_copy, rebind
from .startup import SGLANG_MODULES
from .status import PatchStatus, patch_status

logger = logging.getLogger("rope_compat")

# Name -> the rope-compat functions that can stand in for it, by signature.
REPLACEMENTS: Dict[str, Tuple[Callable, ...]] = {
    "apply_rope_with_cos_sin_cache_inplace": (
        ours.apply_rope_with_cos_sin_cache_inplace,
        api.apply_rope_with_cos_sin_cache_inplace,
    ),
    "apply_rope_inplace": (ours.apply_rope_inplace,),
    "apply_rope_inplace_with_kvcache": (ours.apply_rope_inplace_with_kvcache,),
    "rotary_embedding": (ours.rotary_embedding,),
}

_state = state.sglang
_lock = state.lock


class UnsupportedSglangError(RuntimeError):
    """SGLang is absent, or one of its rope functions has a signature rope-compat does not know."""


def signature_key(fn: Callable) -> List[tuple]:
    """What must match for a replacement: parameter names, kinds and defaults (not annotations)."""
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()]


def _describe(fn: Callable) -> str:
    sig = inspect.signature(fn)
    return str(sig.replace(
        parameters=[p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()],
        return_annotation=inspect.Signature.empty,
    ))


def _plan(module_name: str, module) -> List[Tuple[str, Callable, Callable]]:
    """(name, SGLang's function, rope-compat's) for each known name the module defines;
    UnsupportedSglangError when one of them has a signature no replacement has."""
    plan = []
    for name, candidates in REPLACEMENTS.items():
        original = module.__dict__.get(name)
        if original is None:
            continue
        key = f"{module_name}.{name}"
        if key in _state.functions:  # already patched: its current value is ours
            continue
        try:
            installed = signature_key(original)
        except (TypeError, ValueError) as e:
            raise UnsupportedSglangError(f"{key}: cannot read its signature ({e}); not patching {module_name}")
        match = next((c for c in candidates if signature_key(c) == installed), None)
        if match is None:
            raise UnsupportedSglangError(
                f"{key} has the signature {_describe(original)}, which rope-compat does not know "
                f"(it knows {' and '.join(_describe(c) for c in candidates)}); not patching "
                f"{module_name}"
            )
        plan.append((name, original, match))
    return plan


def _apply(module_name: str, plan) -> None:
    for name, original, replacement in plan:
        copy = distinct_copy(replacement)
        rebind(original, copy)
        _state.functions[f"{module_name}.{name}"] = (original, copy)


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and name.startswith(e.name) and name[len(e.name):][:1] in ("", "."):
            return None  # this SGLang version has no such module
        raise  # SGLang is there but misses a dependency: say so, unchanged


def patch_sglang(modules: Optional[Sequence[str]] = None) -> PatchStatus:
    """Rebind SGLang's rope entry points to rope-compat's (see the module docstring).

    modules: SGLang module names to patch (default: all of SGLANG_MODULES that the installed
    SGLang has). Calling it again does nothing for names already patched. Raises
    UnsupportedSglangError when SGLang has none of the modules, or a signature differs (then
    nothing is rebound).
    """
    names = tuple(SGLANG_MODULES if modules is None else modules)
    with _lock:
        found = [(n, m) for n, m in ((n, _import(n)) for n in names) if m is not None]
        if not found:
            raise UnsupportedSglangError(
                f"none of SGLang's rope modules ({', '.join(names)}) is importable: SGLang is not "
                "installed; use rope_compat.sglang directly"
            )
        plans = [(n, _plan(n, m)) for n, m in found]  # every check before the first rebinding
        for n, plan in plans:
            _apply(n, plan)
        return patch_status()


def patch_at_import(module_name: str) -> None:
    """The start-up route: patch one SGLang module right after it has executed; a signature
    rope-compat does not know is logged, not raised, so SGLang keeps its own kernel."""
    module = sys.modules.get(module_name)
    if module is None:
        return
    with _lock:
        try:
            _apply(module_name, _plan(module_name, module))
        except UnsupportedSglangError as e:
            logger.warning("rope_compat: %s", e)


def _unpatch(keys=None) -> None:
    for key in list(_state.functions) if keys is None else keys:
        original, replacement = _state.functions.pop(key)
        rebind(replacement, original)


def unpatch_sglang() -> PatchStatus:
    """Put SGLang's original functions back wherever the replacements are bound."""
    with _lock:
        _unpatch()
        return patch_status()


@contextlib.contextmanager
def sglang_patched(modules: Optional[Sequence[str]] = None):
    """`patch_sglang(...)` for the duration of a `with` block; names that were patched when
    the block started stay patched after it."""
    with _lock:
        before = set(_state.functions)
        status = patch_sglang(modules)
    try:
        yield status
    finally:
        with _lock:
            _unpatch([k for k in list(_state.functions) if k not in before])
