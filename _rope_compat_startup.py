"""rope-compat's start-up switch, `ROPE_COMPAT_PATCH`: standard library only.

(The finder and loaders are plain classes with the protocol's methods: importing
importlib.abc for its base classes would cost more than the rest of this module.)

`rope_compat_startup.pth` (installed into site-packages) imports this module at interpreter
start-up when the variable is set and not "0", and calls `activate()`. Nothing here imports
torch or rope_compat: activation only puts a meta-path finder in front of the import system.
The finder acts when the process imports one of the modules a route targets, and only then
imports rope_compat; an interpreter that imports none of them pays for this module alone.

The value is a comma-separated list of routes (case and spaces ignored):

- `1` (or `vllm`): patch a real vLLM's Python functions, once `vllm._custom_ops` has run.
- `dispatcher`: register rope-compat as the kernel of vLLM's op, at the same moment.
- `alias` (or `vllm-alias`): where vLLM is absent, `import vllm` gets rope-compat's
  `vllm._custom_ops` alias; where a real vLLM is installed it only warns.
- `sglang`: patch SGLang's rope entry points (`rope_compat.patch_sglang()`) as soon as one of
  SGLang's rope modules has run, before any other module can from-import the names.
- `sgl-kernel-alias`: where sgl-kernel is absent, `import sgl_kernel` gets rope-compat's alias
  (`rope_compat.install_sgl_kernel_alias()`); a real sgl-kernel is imported as usual.
- `0` or unset: nothing (vLLM's plugin entry point then applies its default).

At most one of the three vLLM routes. An unknown or conflicting value is ignored as a
whole, with one RuntimeWarning per process.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

ENV_VAR = "ROPE_COMPAT_PATCH"
_TOKENS = {
    "1": "functions", "vllm": "functions", "dispatcher": "dispatcher",
    "alias": "vllm-alias", "vllm-alias": "vllm-alias",
    "sglang": "sglang", "sgl-kernel-alias": "sgl-kernel-alias",
}
VLLM_ROUTES = ("functions", "dispatcher", "vllm-alias")
VLLM_OPS = "vllm._custom_ops"
# SGLang's modules that define its rope entry points (rope_compat.compat.sglang_patch).
SGLANG_MODULES = ("sglang.kernels.ops.attention.rope", "sglang.jit_kernel.rope", "sglang.jit_kernel.pos_enc")

_lock = threading.RLock()
_warned = False
_finder = None  # the installed _Finder, if any


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def routes_from_env(environ=os.environ):
    """The routes the variable asks for, in order: None when unset or empty, () for "0" or
    an invalid value (which warns once per process)."""
    value = environ.get(ENV_VAR, "").strip().lower()
    if value == "":
        return None
    if value == "0":
        return ()
    routes, bad = [], []
    for token in value.split(","):
        token = token.strip()
        if not token:
            continue
        route = _TOKENS.get(token)
        if route is None:
            bad.append(repr(token))
        elif route not in routes:
            routes.append(route)
    if len([r for r in routes if r in VLLM_ROUTES]) > 1:
        bad.append("more than one of 1, dispatcher, alias")
    if bad or not routes:
        _warn_once(
            f"rope_compat: ignoring {ENV_VAR}={value!r} ({', '.join(bad) or 'empty'}); expected a "
            "comma-separated list of 1 (or vllm), dispatcher, alias, sglang, sgl-kernel-alias, or 0"
        )
        return ()
    return tuple(routes)


class _CallbackLoader:
    """Runs the real loader, then `callback(name)` (with the module fully executed)."""

    def __init__(self, loader, callback):
        self._loader, self._callback = loader, callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._callback(module.__name__)

    def __getattr__(self, name):  # get_source, get_resource_reader, ... of the real loader
        return getattr(self.__dict__["_loader"], name)


class _AliasLoader:
    """Hands the import the alias module that was just put in sys.modules."""

    def create_module(self, spec):
        return sys.modules[spec.name]

    def exec_module(self, module) -> None:
        pass


def _real_spec(finder, fullname, path, target):
    for other in sys.meta_path:  # the spec the import would get without us
        if other is finder or not hasattr(other, "find_spec"):
            continue
        spec = other.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


class _Finder:
    """after: module name -> callback run right after that module has executed.
    instead: module name -> callback run when no real module of that name exists; it puts
    a stand-in into sys.modules (or returns False when it did not)."""

    def __init__(self):
        self.after, self.instead = {}, {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.after and fullname not in self.instead:
            return None
        spec = _real_spec(self, fullname, path, target)
        if fullname in self.instead:
            callback = _take(self.instead, fullname)
            if callback(spec is not None):
                # The import system returns the spec of a module that is already in sys.modules
                # (the alias's own); with this loader, loading it hands back that same module.
                spec = sys.modules[fullname].__spec__
                spec.loader = _AliasLoader()
            return spec
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CallbackLoader(spec.loader, lambda name: _take(self.after, name)(name))
        return spec


def _take(table, name):
    """Remove and return table[name]; the finder leaves sys.meta_path when nothing is left."""
    global _finder
    with _lock:
        callback = table.pop(name, None)
        if _finder is not None and not _finder.after and not _finder.instead:
            if _finder in sys.meta_path:
                sys.meta_path.remove(_finder)
            _finder = None
    return callback or (lambda *a: False)


def _watch(table_name, name, callback):
    global _finder
    with _lock:
        if _finder is None:
            _finder = _Finder()
            sys.meta_path.insert(0, _finder)
        getattr(_finder, table_name)[name] = callback


def pending_routes():
    """What the finder still waits for: the routes whose target module is not imported yet."""
    with _lock:
        if _finder is None:
            return ()
        names = list(_finder.after) + list(_finder.instead)
        return tuple(dict.fromkeys(getattr(_finder, "routes", {}).get(n, n) for n in names))


def _note(name, route):
    _finder.__dict__.setdefault("routes", {})[name] = route


# The callbacks import rope_compat, at the moment its work is needed.

def _vllm_route(route):
    def apply(_name=None):
        from rope_compat.compat.startup import apply_vllm_route

        apply_vllm_route(route)
    return apply


def _vllm_alias(real_found=False):
    if real_found:
        _warn_once(
            f"rope_compat: {ENV_VAR} asks for the vllm alias, but a real vLLM is installed; the "
            "alias is not installed (use rope_compat.patch_vllm() or " + ENV_VAR + "=1 to route vLLM's op)"
        )
        return False
    from rope_compat.compat.alias import install_vllm_alias

    return install_vllm_alias()


def _sglang(name):
    from rope_compat.compat.sglang_patch import patch_at_import

    patch_at_import(name)


def _sgl_kernel_alias(real_found=False):
    if real_found:  # never shadow a real sgl-kernel
        return False
    from rope_compat.compat.sgl_kernel_alias import install_sgl_kernel_alias

    return install_sgl_kernel_alias()


def activate(routes=None) -> None:
    """Arrange `routes` (default: from the variable); each applies now if its target module is
    already imported, else when it is."""
    routes = routes_from_env() if routes is None else tuple(routes)
    for route in routes or ():
        if route in ("functions", "dispatcher"):
            if VLLM_OPS in sys.modules:
                _vllm_route(route)()
            else:
                _watch("after", VLLM_OPS, _vllm_route(route))
                _note(VLLM_OPS, route)
        elif route == "vllm-alias":
            if "vllm" in sys.modules:
                _vllm_alias()  # a real vLLM already imported: it warns
            else:
                _watch("instead", "vllm", _vllm_alias)
                _note("vllm", route)
        elif route == "sglang":
            for name in SGLANG_MODULES:
                if name in sys.modules:
                    _sglang(name)
                else:
                    _watch("after", name, _sglang)
                    _note(name, route)
        elif route == "sgl-kernel-alias":
            if "sgl_kernel" not in sys.modules:
                _watch("instead", "sgl_kernel", _sgl_kernel_alias)
                _note("sgl_kernel", route)
        else:
            raise ValueError(f"route: unknown {route!r}")
