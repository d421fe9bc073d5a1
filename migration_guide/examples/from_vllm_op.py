"""From vLLM's rotary op to rope-compat: the same call, without vLLM.

Before (needs vLLM):

    from vllm import _custom_ops as ops
    ops.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
    ops.batched_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox,
                                 rot_dim, cos_sin_cache_offsets)   # older vLLM only

After:

    import rope_compat
    rope_compat.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
    rope_compat.batched_rotary_embedding(...same arguments...)

Same argument names, order and defaults (`rope_dim_offset=0, inverse=False` included), same
in-place semantics. Every case below is checked against a float64 computation.
"""

import torch

import rope_compat
from reference64 import check, default_freqs, rope64

torch.manual_seed(0)

# 1. A Llama-style layer: bf16 q and k are slices of the fused qkv projection (strided views,
#    last dim contiguous), int64 positions, NeoX style, a float32 cache with bf16 q/k.
T, Hq, Hk, D = 7, 8, 2, 128
positions = torch.randint(0, 8192, (T,))
qkv = torch.randn(T, (Hq + 2 * Hk) * D, dtype=torch.bfloat16)
query, key, value = qkv.split([Hq * D, Hk * D, Hk * D], dim=-1)
q0, k0, v0 = query.clone(), key.clone(), value.clone()
cache = rope_compat.compute_cos_sin_cache(D, 8192, {"rope_theta": 500000.0})  # float32
rope_compat.rotary_embedding(positions, query, key, D, cache, True)
freqs = default_freqs(D, 500000.0)
check("fused qkv: query", query, rope64(q0, positions, D, freqs, True))
check("fused qkv: key", key, rope64(k0, positions, D, freqs, True))
assert torch.equal(value, v0), "the value part of qkv must not change"
print("vLLM op -> rope_compat.rotary_embedding: fused bf16 qkv, float32 cache: OK")

# 2. GPT-J style, partial rotation (the first 64 of 256 dims), int32 positions, per-head
#    layout [tokens, heads, head_size], and key=None (a layer that reuses another's KV).
D, rot = 256, 64
positions = torch.randint(0, 2048, (5,), dtype=torch.int32)
query = torch.randn(5, 4, D, dtype=torch.float16)
q0 = query.clone()
cache = rope_compat.compute_cos_sin_cache(rot, 2048)
rope_compat.rotary_embedding(positions, query, None, D, cache, False)
check("GPT-J partial, key=None", query, rope64(q0, positions, D, default_freqs(rot, 10000.0), False))
assert torch.equal(query[..., rot:], q0[..., rot:]), "dims past rot_dim must not change"
print("vLLM op -> rope_compat.rotary_embedding: GPT-J, partial rotation, key=None: OK")

# 3. vLLM's newer arguments: rope_dim_offset (rotate dims [offset, offset + rot_dim)) and
#    inverse (rotate back). Rotating forward then back returns the input.
query = torch.randn(6, 2 * 96)
q0 = query.clone()
positions = torch.randint(0, 2048, (6,))
cache = rope_compat.compute_cos_sin_cache(32, 2048)
rope_compat.rotary_embedding(positions, query, None, 96, cache, True, rope_dim_offset=32)
expected = q0.view(6, 2, 96).double().clone()
expected[..., 32:64] = rope64(q0.view(6, 2, 96)[..., 32:64], positions, 32, default_freqs(32, 1e4), True)
check("rope_dim_offset=32", query, expected.view(6, -1))
rope_compat.rotary_embedding(positions, query, None, 96, cache, True, rope_dim_offset=32, inverse=True)
check("inverse round trip", query, q0.double())
print("vLLM op -> rope_compat.rotary_embedding: rope_dim_offset and inverse: OK")

# 4. The former multi-LoRA op: one cache per scaling factor, stacked; token t reads row
#    cos_sin_cache_offsets[t] + positions[t]. Here factor 1 rows, then linear factor 4 rows.
D, rows = 64, 1024
caches = [
    rope_compat.compute_cos_sin_cache(D, rows),
    rope_compat.compute_cos_sin_cache(D, rows, {"rope_type": "linear", "factor": 4.0}),
]
stacked = torch.cat(caches)
which = torch.tensor([0, 1, 1, 0, 1])  # the adapter (cache) of each token
offsets = which * rows
positions = torch.randint(0, rows, (5,))
query, key = torch.randn(5, 4 * D), torch.randn(5, 2 * D)
q0, k0 = query.clone(), key.clone()
rope_compat.batched_rotary_embedding(positions, query, key, D, stacked, True, D, offsets)
for t in range(5):
    freqs = default_freqs(D, 1e4) / (4.0 if which[t] else 1.0)
    check(f"batched token {t}: query", query[t : t + 1], rope64(q0[t : t + 1], positions[t : t + 1], D, freqs, True))
    check(f"batched token {t}: key", key[t : t + 1], rope64(k0[t : t + 1], positions[t : t + 1], D, freqs, True))
print("vLLM batched_rotary_embedding -> rope_compat.batched_rotary_embedding: OK")
