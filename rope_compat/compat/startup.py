"""Start-up activation by the `ROPE_COMPAT_PATCH` environment variable.

The installed `rope_compat_startup.pth` runs one line at every interpreter start-up; it
checks the variable and, only when it is set (and not "0"), imports this module and calls
`activate()`. Child processes inherit the variable, so an engine's worker processes are
covered with no code change. Values:

- `1`: patch a real vLLM's Python functions (`patch_vllm()`).
- `dispatcher`: register rope-compat as the kernel of vLLM's op (`patch_vllm(dispatcher=True)`).
- `alias`: install the `vllm._custom_ops` alias (`install_vllm_alias()`); where a real vLLM
  is installed it only warns.
- `0` or unset: nothing (the vLLM plugin then applies its default, see `plugin`).

vLLM is rarely imported yet at start-up, so the patch waits: an import hook applies it
right after `vllm._custom_ops` has been executed (that import is what loads vLLM's ops).
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import sys
import threading
from typing import Callable, Mapping, Optional

ENV_VAR = "ROPE_COMPAT_PATCH"
TARGET = "vllm._custom_ops"
_ROUTES = {"1": "functions", "dispatcher": "dispatcher", "alias": "alias"}

logger = logging.getLogger("rope_compat")
_lock = threading.Lock()
_hook: Optional["_AfterImportHook"] = None


def route_from_env(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """'functions', 'dispatcher', 'alias', 'off' (value "0"), or None when unset or empty."""
    value = environ.get(ENV_VAR, "").strip().lower()
    if value == "":
        return None
    if value == "0":
        return "off"
    if value not in _ROUTES:
        logger.warning("rope_compat: ignoring %s=%r (expected 1, dispatcher, alias or 0)", ENV_VAR, value)
        return "off"
    return _ROUTES[value]


class _CallbackLoader(importlib.abc.Loader):
    """Runs the real loader, then `callback` (with the module fully executed)."""

    def __init__(self, loader: importlib.abc.Loader, callback: Callable[[], None]):
        self._loader, self._callback = loader, callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._callback()

    def __getattr__(self, name: str):  # get_source, get_resource_reader, ... of the real loader
        return getattr(self.__dict__["_loader"], name)


class _AfterImportHook(importlib.abc.MetaPathFinder):
    """Meta-path finder that wraps the loader of one module to run a callback after it."""

    def __init__(self, target: str, route: str):
        self.target, self.route = target, route

    def find_spec(self, fullname, path, target=None):
        if fullname != self.target:
            return None
        for finder in sys.meta_path:  # the spec the import would get without us
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CallbackLoader(spec.loader, self._fire)
        return spec

    def _fire(self) -> None:
        _remove_hook()
        _apply(self.route)


def _remove_hook() -> None:
    global _hook
    with _lock:
        if _hook is not None and _hook in sys.meta_path:
            sys.meta_path.remove(_hook)
        _hook = None


def _apply(route: str) -> None:
    """Apply a vLLM route now; a vLLM rope-compat cannot patch is logged, not raised, so a
    start-up switch never stops the engine (it then runs with vLLM's own kernel)."""
    from .vllm_patch import UnsupportedVllmError, patch_vllm

    try:
        patch_vllm(dispatcher=route == "dispatcher")
    except UnsupportedVllmError as e:
        logger.warning("rope_compat: %s", e)


def patch_when_imported(route: str) -> None:
    """Apply `route` ('functions' or 'dispatcher') now if `vllm._custom_ops` is imported,
    else right after it is."""
    global _hook
    if route not in ("functions", "dispatcher"):
        raise ValueError(f"route: expected 'functions' or 'dispatcher', got {route!r}")
    with _lock:
        if _hook is not None:
            _hook.route = route
            return
        if TARGET not in sys.modules:
            _hook = _AfterImportHook(TARGET, route)
            sys.meta_path.insert(0, _hook)
            return
    _apply(route)


def pending_route() -> Optional[str]:
    """The route the import hook will apply, or None when no hook is waiting."""
    return None if _hook is None else _hook.route


def activate(route: Optional[str] = None) -> None:
    """Apply `route` (default: from `ROPE_COMPAT_PATCH`); called by the start-up .pth line."""
    route = route_from_env() if route is None else route
    if route in ("functions", "dispatcher"):
        patch_when_imported(route)
    elif route == "alias":
        from .alias import install_vllm_alias

        install_vllm_alias()
