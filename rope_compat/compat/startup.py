"""Start-up activation by the `ROPE_COMPAT_PATCH` environment variable.

The parsing and the import hook live in the top-level module `_rope_compat_startup`, which
imports only the standard library, so that the installed `rope_compat_startup.pth` costs an
interpreter nothing it does not use (no torch, no rope_compat) until the process imports a
module a route targets. Its docstring lists the values; child processes inherit the
variable, so an engine's worker processes are covered with no code change.

This module is the package-side view of it: the vLLM route the plugin reads, the routes still
pending, and the vLLM patch the hook applies.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Optional, Tuple

import _rope_compat_startup as _hook
from _rope_compat_startup import ENV_VAR, SGLANG_MODULES, activate, routes_from_env  # noqa: F401

logger = logging.getLogger("rope_compat")

__all__ = ["ENV_VAR", "SGLANG_MODULES", "activate", "routes_from_env", "route_from_env",
           "pending_routes", "patch_when_imported", "apply_vllm_route"]


def route_from_env(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The vLLM route asked for: 'functions', 'dispatcher', 'alias', 'off' (value "0" or
    invalid), or None when unset or when the value names no vLLM route (vLLM's plugin then
    applies its default)."""
    routes = routes_from_env(environ)
    if routes is None:
        return None
    if not routes:
        return "off"
    for route in routes:
        if route in ("functions", "dispatcher"):
            return route
        if route == "vllm-alias":
            return "alias"
    return None


def pending_routes() -> Tuple[str, ...]:
    """The routes whose target module has not been imported yet."""
    return _hook.pending_routes()


def apply_vllm_route(route: str) -> None:
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
    if route not in ("functions", "dispatcher"):
        raise ValueError(f"route: expected 'functions' or 'dispatcher', got {route!r}")
    activate((route,))
