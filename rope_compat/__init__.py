"""rope-compat: rotary position embedding for LLM inference engines.

vLLM's `rotary_embedding` op with vLLM's exact semantics, FlashInfer's and sgl-kernel's
names, one `torch.library` op behind them all, served by a CUDA kernel where it is built
and by a Torch implementation everywhere else.
"""

__version__ = "0.1.0"

from .api import (
    apply_rope_inplace_with_cache,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
    batched_rotary_embedding,
    mrope_rotary_embedding,
    mrope_rotary_embedding_set_kv,
    positions_from_offsets,
    rotary_embedding,
    rotary_embedding_set_kv,
)
from .ops.extension import backend_for, has_cuda_kernel
from .rope import MRotaryEmbedding, RotaryEmbedding, compute_cos_sin_cache, get_rope
from .compat.alias import install_vllm_alias, uninstall_vllm_alias
from .compat.sgl import FusedSetKVBufferArg
from .compat.status import PatchStatus, patch_status
from .compat.vllm_patch import UnsupportedVllmError, patch_vllm, unpatch_vllm, vllm_patched
from .compat.sgl_kernel_alias import install_sgl_kernel_alias, uninstall_sgl_kernel_alias
from .compat.sglang_patch import UnsupportedSglangError, patch_sglang, sglang_patched, unpatch_sglang
from . import sglang

__all__ = [
    "__version__",
    "rotary_embedding",
    "apply_rope_inplace_with_cache",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "batched_rotary_embedding",
    "positions_from_offsets",
    "backend_for",
    "has_cuda_kernel",
    "compute_cos_sin_cache",
    "RotaryEmbedding",
    "MRotaryEmbedding",
    "get_rope",
    "patch_vllm",
    "unpatch_vllm",
    "vllm_patched",
    "patch_status",
    "PatchStatus",
    "UnsupportedVllmError",
    "install_vllm_alias",
    "uninstall_vllm_alias",
    "FusedSetKVBufferArg",
    "rotary_embedding_set_kv",
    "mrope_rotary_embedding",
    "mrope_rotary_embedding_set_kv",
    "patch_sglang",
    "unpatch_sglang",
    "sglang_patched",
    "UnsupportedSglangError",
    "install_sgl_kernel_alias",
    "uninstall_sgl_kernel_alias",
    "sglang",
]
