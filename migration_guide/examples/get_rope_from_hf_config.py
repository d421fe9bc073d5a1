"""From vLLM's `get_rope` to rope-compat's, fed from a Hugging Face config.

Before (needs vLLM, and a vLLM config context for some variants):

    from vllm.model_executor.layers.rotary_embedding import get_rope
    rope = get_rope(head_size, max_position, is_neox_style, rope_parameters, dtype)
    query, key = rope(positions, query, key)

After:

    from rope_compat import get_rope
    ...the same two lines...

The positional arguments are vLLM 0.32's. Callers of older vLLM (`get_rope(head_size,
rotary_dim, max_position, base, ..., rope_scaling=...)`) pass `base=`, `rotary_dim=` or
`partial_rotary_factor=` as keywords instead. Two differences: `forward` always rotates in
place (like vLLM's `forward_cuda`; vLLM's `forward_native` returns new tensors), and the
cache is float32 by default whatever `dtype` is (`cache_dtype=dtype` gives vLLM's rounding).
"""

import math

import torch

from rope_compat import get_rope
from reference64 import check, default_freqs, rope64

torch.manual_seed(0)


def rope_parameters(config: dict) -> dict:
    """The RoPE dict of a config: `rope_parameters` (transformers >= 5), or the older
    top-level `rope_theta` / `partial_rotary_factor` plus the `rope_scaling` dict."""
    if "rope_parameters" in config:
        return dict(config["rope_parameters"])
    params = dict(config.get("rope_scaling") or {})
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in config:
            params[key] = config[key]
    return params


# 1. A Llama 3.1 config (the RoPE part of it), older style: rope_scaling + rope_theta.
llama31 = {
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}
D = llama31["head_dim"]
rope = get_rope(D, llama31["max_position_embeddings"], True, rope_parameters(llama31), torch.bfloat16)
assert rope.cos_sin_cache.shape == (131072, 128) and rope.cos_sin_cache.dtype == torch.float32

T = 9
positions = torch.randint(0, 131072, (T,))
query = torch.randn(T, 32 * D, dtype=torch.bfloat16)
key = torch.randn(T, 8 * D, dtype=torch.bfloat16)
q0, k0 = query.clone(), key.clone()
q_out, k_out = rope(positions, query, key)
assert q_out is query and k_out is key, "forward rotates in place and returns its inputs"

# Llama 3.1's frequencies as transformers writes them: by wavelength against the trained length.
f = default_freqs(D, 500000.0)
wavelen = 2 * math.pi / f
smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
freqs = torch.where(wavelen > 8192 / 1.0, f / 8.0, (1 - smooth) * f / 8.0 + smooth * f)
freqs = torch.where(wavelen < 8192 / 4.0, f, freqs)
check("llama3.1 query", query, rope64(q0, positions, D, freqs, True))
check("llama3.1 key", key, rope64(k0, positions, D, freqs, True))
print("get_rope(Llama 3.1 config) -> rope_compat.get_rope: OK")

# 2. A Phi-2 style config, newer style: rope_parameters with a partial rotary factor
#    (0.4 of head_dim 80: the first 32 dims rotate). Also the older keyword form.
phi = {"head_dim": 80, "max_position_embeddings": 2048,
       "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.4}}
rope = get_rope(80, 2048, True, rope_parameters(phi), torch.float16)
older = get_rope(80, 2048, True, None, torch.float16, base=10000.0, partial_rotary_factor=0.4)
assert rope.rotary_dim == older.rotary_dim == 32
assert torch.equal(rope.cos_sin_cache, older.cos_sin_cache)
positions = torch.randint(0, 2048, (T,))
query = torch.randn(T, 32, 80, dtype=torch.float16)  # [tokens, heads, head_size] works as well
q0 = query.clone()
rope(positions, query)  # key defaults to None
check("phi partial query", query, rope64(q0, positions, 80, default_freqs(32, 10000.0), True))
print("get_rope(partial_rotary_factor config) -> rope_compat.get_rope: OK")
