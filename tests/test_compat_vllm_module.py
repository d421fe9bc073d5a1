"""vLLM's own RotaryEmbedding module runs through rope-compat once vLLM is patched.

Needs vLLM's Python layer (`vllm.model_executor.layers.rotary_embedding`), which imports far
more of vLLM than its kernels do; skipped where that layer does not import.
"""

import pytest
import torch

import rope_compat
from rope_compat import api
from tolerances import assert_matches_reference


def _vllm_layer():
    try:
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.model_executor.layers.rotary_embedding import get_rope
    except Exception:  # missing optional packages raise more than ImportError
        return None
    return get_rope, VllmConfig, set_current_vllm_config


VLLM = _vllm_layer()
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(VLLM is None, reason="vLLM's Python layer does not import here")]


@pytest.mark.parametrize("dispatcher", [False, True], ids=["function-route", "dispatcher-route"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vllm_rotary_module_runs_through_rope_compat(dispatcher, dtype, monkeypatch):
    get_rope, VllmConfig, set_config = VLLM
    with set_config(VllmConfig()):
        module = get_rope(128, 4096, True, {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 2048}, dtype)
    positions = torch.randint(0, 4096, (37,))
    query = torch.randn(37, 8 * 128, dtype=dtype)
    key = torch.randn(37, 2 * 128, dtype=dtype)
    expected_q, expected_k = module.forward_native(positions, query.clone(), key.clone())

    calls = []
    # What serves eager CPU calls: the compiled CPU kernel's launch, or the Torch implementation.
    real = api._cpu_direct
    monkeypatch.setattr(api, "_cpu_direct", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    rope_compat.patch_vllm(dispatcher=dispatcher)
    try:
        q, k = module.forward_cpu(positions, query, key)  # vLLM's CPU path calls ops.rotary_embedding
    finally:
        rope_compat.unpatch_vllm()
    assert calls, "vLLM's module did not reach rope-compat"
    assert q is query and k is key  # rotated in place, as vLLM's op does
    assert_matches_reference(q, expected_q.double(), "query")
    assert_matches_reference(k, expected_k.double(), "key")
