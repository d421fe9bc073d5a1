"""Finding and rebinding module-level names that hold one object (shared by the patches)."""

from __future__ import annotations

import sys
import types
from typing import Callable, Iterator, Tuple

from .. import api


def distinct_copy(fn: Callable) -> Callable:
    """A new function object running `fn`'s code: no extra call layer, but an identity
    of its own, so unpatching finds exactly the names the patch (or later imports) bound."""
    if not isinstance(fn, types.FunctionType):  # a compiled entry point (api.compiled_entry)
        return api.compiled_entry_copy(fn.__name__)
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__, copy.__doc__, copy.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    copy.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    return copy


def runs_code_of(fn: object, ours: Callable) -> bool:
    """Whether `fn` runs `ours`'s code: `ours` itself or a distinct_copy of it."""
    if isinstance(ours, types.FunctionType):
        return getattr(fn, "__code__", None) is ours.__code__
    return fn is ours or fn is api.compiled_entry_copies.get(getattr(ours, "__name__", None))


def module_bindings(target: object) -> Iterator[Tuple[str, dict, str]]:
    """(module name, module dict, attribute) for every module global that is `target`."""
    seen = set()
    for mod_name, module in list(sys.modules.items()):
        try:
            namespace = vars(module)
        except TypeError:  # None placeholders and odd objects in sys.modules
            continue
        if not isinstance(namespace, dict):  # e.g. a class standing in as a module
            continue
        # One module can sit under two names (multiprocessing adds `__mp_main__` for
        # `__main__`): report it once, under the first.
        if id(namespace) in seen:
            continue
        seen.add(id(namespace))
        for attr, value in list(namespace.items()):
            if value is target:
                yield mod_name, namespace, attr


def rebind(old: object, new: object) -> None:
    for _, namespace, attr in list(module_bindings(old)):
        namespace[attr] = new
