"""vLLM general plugin: vLLM calls `register()` in each of its processes, workers included.

Installing rope-compat next to vLLM is the switch: the plugin routes vLLM's rotary op
through rope-compat in every vLLM process. By default it uses the dispatcher route, which
keeps vLLM's compiled graphs (and the passes that match `_C::rotary_embedding`) unchanged.
`ROPE_COMPAT_PATCH=1` selects the function route instead, `ROPE_COMPAT_PATCH=0` turns the
plugin off; so does vLLM's own `VLLM_PLUGINS` allowlist when it does not name `rope_compat`.
"""

from __future__ import annotations

import logging

import torch

from .. import backend_for
from .startup import route_from_env
from .vllm_patch import UnsupportedVllmError, patch_vllm

logger = logging.getLogger("rope_compat")


def register() -> None:
    route = route_from_env()
    if route == "off":
        return
    try:
        status = patch_vllm(dispatcher=route != "functions")
    except UnsupportedVllmError as e:  # keep vLLM running, with its own kernel
        logger.warning("rope_compat plugin: %s", e)
        return
    if torch.cuda.is_available() and backend_for("cuda") != "cuda-kernel":
        logger.warning(
            "rope_compat plugin: rope-compat's CUDA kernel is not built; vLLM's op now runs "
            "rope-compat's Torch implementation on CUDA (set ROPE_COMPAT_PATCH=0 to keep vLLM's)"
        )
    logger.info("rope_compat plugin: vLLM's rotary op routed through rope-compat: %s", status)
