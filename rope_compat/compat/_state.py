"""What the patches have changed, in one place: the patch modules write it, `status` reads it.

Keeping it apart from both is what keeps the compat layer free of import cycles:
vllm_patch and sglang_patch import status (to return it), status imports only this module,
the aliases and startup.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import torch

# One lock for every patch and unpatch, so concurrent calls apply or undo each route once.
lock = threading.RLock()


@dataclass
class VllmState:
    # function name -> (vLLM's original, rope-compat's replacement)
    functions: Dict[str, Tuple[Callable, Callable]] = field(default_factory=dict)
    library: Optional[torch.library.Library] = None
    dispatch_keys: Tuple[str, ...] = ()
    schema: Optional[str] = None


@dataclass
class SglangState:
    # "module.name" -> (SGLang's original, rope-compat's replacement)
    functions: Dict[str, Tuple[Callable, Callable]] = field(default_factory=dict)


vllm = VllmState()
sglang = SglangState()
