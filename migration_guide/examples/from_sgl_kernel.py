"""From sgl-kernel's RoPE (with the fused KV-cache write) to rope-compat.

Before (needs sgl-kernel and a CUDA GPU):

    from sgl_kernel import FusedSetKVBufferArg, apply_rope_with_cos_sin_cache_inplace

After (any device):

    from rope_compat import FusedSetKVBufferArg, apply_rope_with_cos_sin_cache_inplace

Same arguments, defaults and dataclass fields. With `fused_set_kv_buffer_arg`, the rotated key
and the value of token i are also stored at row `cache_loc[i]` of `k_buffer` and `v_buffer`
(the KV pool), as SGLang's attention backends ask for. sgl-kernel's own dataclass instances
are accepted too. `enable_pdl` only changes how sgl-kernel launches; it is accepted and has
no effect on results.
"""

import torch

from rope_compat import FusedSetKVBufferArg, apply_rope_with_cos_sin_cache_inplace, compute_cos_sin_cache
from reference64 import check, default_freqs, rope64

torch.manual_seed(0)
T, Hq, Hk, D, pool_rows = 6, 8, 2, 128, 64

# An SGLang-style forward step: fused qkv projection output, a paged KV pool, and the pool
# rows that the scheduler gave this batch's tokens.
qkv = torch.randn(T, (Hq + 2 * Hk) * D, dtype=torch.bfloat16)
q, k, v = qkv.split([Hq * D, Hk * D, Hk * D], dim=-1)
q0, k0 = q.clone(), k.clone()
k_buffer = torch.randn(pool_rows, Hk, D, dtype=torch.bfloat16)  # old contents, must survive
v_buffer = torch.randn(pool_rows, Hk, D, dtype=torch.bfloat16)
k_pool0, v_pool0 = k_buffer.clone(), v_buffer.clone()
cache_loc = torch.randperm(pool_rows)[:T]  # int64, as sgl-kernel requires
positions = torch.randint(0, 32768, (T,))
cos_sin_cache = compute_cos_sin_cache(D, 32768, {"rope_theta": 1e6})  # float32

apply_rope_with_cos_sin_cache_inplace(
    positions, q, k, D, cos_sin_cache, is_neox=True,
    fused_set_kv_buffer_arg=FusedSetKVBufferArg(
        value=v, k_buffer=k_buffer, v_buffer=v_buffer, k_scale=None, v_scale=None, cache_loc=cache_loc,
    ),
    enable_pdl=None,
)

freqs = default_freqs(D, 1e6)
check("query", q, rope64(q0, positions, D, freqs, True))
check("key", k, rope64(k0, positions, D, freqs, True))
assert torch.equal(k_buffer[cache_loc], k.view(T, Hk, D)), "k_buffer rows must hold the rotated key"
assert torch.equal(v_buffer[cache_loc], v.view(T, Hk, D)), "v_buffer rows must hold the value"
others = torch.ones(pool_rows, dtype=torch.bool)
others[cache_loc] = False
assert torch.equal(k_buffer[others], k_pool0[others]) and torch.equal(v_buffer[others], v_pool0[others]), (
    "rows not in cache_loc must not change"
)
print("sgl_kernel apply_rope_with_cos_sin_cache_inplace(fused_set_kv_buffer_arg) -> rope_compat: OK")
