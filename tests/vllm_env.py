"""Whether vLLM's ops import here: the one condition for every test that needs vLLM.

Installed is not enough: a vLLM installed without its dependencies fails at import, and the
tests that need it must then skip, as they do without vLLM.
"""

import functools


@functools.lru_cache(maxsize=None)
def vllm_importable() -> bool:
    try:
        import vllm._custom_ops  # noqa: F401
    except Exception:  # ImportError, or whatever a half-installed vLLM raises at import
        return False
    return True
