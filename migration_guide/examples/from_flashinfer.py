"""From FlashInfer's RoPE functions to rope-compat.

FlashInfer has two families:

- with a precomputed cos/sin cache (`apply_rope_with_cos_sin_cache[_inplace]`): same
  arguments in rope-compat, under the same names;
- computing cos/sin inside the kernel from `rope_scale` / `rope_theta` (and the Llama 3.1
  parameters), with positions given per token (`apply_rope_pos_ids*`) or as ragged
  `indptr` + `offsets` (`apply_rope*`, `apply_llama31_rope*`): in rope-compat, build the
  cache once with `compute_cos_sin_cache`, convert ragged offsets with
  `positions_from_offsets`, and call the cache API. FlashInfer's `interleave` is
  `not is_neox`.

The float64 checks below follow FlashInfer's formulas, written out here, so they also show
that the cache built from FlashInfer's parameters holds the same frequencies.
"""

import math

import torch

import rope_compat
from reference64 import check, default_freqs, rope64

torch.manual_seed(0)
nnz, Hq, Hk, D = 10, 4, 2, 128

# 1. The cos/sin cache API, out of place and in place.
#    FlashInfer: q_out, k_out = flashinfer.rope.apply_rope_with_cos_sin_cache(
#                    positions, query, key, head_size, cos_sin_cache, is_neox=True)
#                flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(...same...)
positions = torch.randint(0, 4096, (nnz,))
query = torch.randn(nnz, Hq * D, dtype=torch.bfloat16)
key = torch.randn(nnz, Hk * D, dtype=torch.bfloat16)
q0, k0 = query.clone(), key.clone()
cache = rope_compat.compute_cos_sin_cache(D, 4096, {"rope_theta": 1e6})  # float32, as FlashInfer requires
q_out, k_out = rope_compat.apply_rope_with_cos_sin_cache(positions, query, key, D, cache, is_neox=True)
assert torch.equal(query, q0) and torch.equal(key, k0), "out-of-place must leave its inputs alone"
freqs = default_freqs(D, 1e6)
check("out of place: query", q_out, rope64(q0, positions, D, freqs, True))
check("out of place: key", k_out, rope64(k0, positions, D, freqs, True))
rope_compat.apply_rope_with_cos_sin_cache_inplace(positions, query, key, D, cache, is_neox=True)
assert torch.equal(query, q_out) and torch.equal(key, k_out), "in place must give the same values"
print("flashinfer apply_rope_with_cos_sin_cache[_inplace] -> same names in rope_compat: OK")


def flashinfer_cache(rotary_dim, max_position, rope_scale, rope_theta):
    """The cache of FlashInfer's computed-cos/sin functions: frequencies divided by rope_scale,
    i.e. linear position interpolation."""
    params = {"rope_theta": rope_theta}
    if rope_scale != 1:
        params.update(rope_type="linear", factor=rope_scale)
    return rope_compat.compute_cos_sin_cache(rotary_dim, max_position, params)


# 2. Per-token positions, cos/sin computed from rope_scale and rope_theta.
#    FlashInfer: q_rope, k_rope = flashinfer.apply_rope_pos_ids(
#                    q, k, pos_ids, rotary_dim=64, interleave=True, rope_scale=2, rope_theta=1e4)
#    q and k are [nnz, heads, head_dim]; rope-compat takes that layout as it is.
q = torch.randn(nnz, Hq, D, dtype=torch.float16)
k = torch.randn(nnz, Hk, D, dtype=torch.float16)
pos_ids = torch.randint(0, 4096, (nnz,), dtype=torch.int32)
interleave = True
cache = flashinfer_cache(rotary_dim=64, max_position=4096, rope_scale=2.0, rope_theta=1e4)
q_rope, k_rope = rope_compat.apply_rope_with_cos_sin_cache(pos_ids, q, k, D, cache, is_neox=not interleave)
freqs = default_freqs(64, 1e4) / 2.0  # FlashInfer: rope_theta ** (-2i / rotary_dim) / rope_scale
check("pos_ids: q", q_rope, rope64(q, pos_ids, D, freqs, False))
check("pos_ids: k", k_rope, rope64(k, pos_ids, D, freqs, False))
print("flashinfer apply_rope_pos_ids(rope_scale, rope_theta) -> cache builder + cache API: OK")

# 3. Ragged batch: request i owns tokens [indptr[i], indptr[i+1]), whose positions count up
#    from offsets[i] (tokens already in its KV cache).
#    FlashInfer: flashinfer.apply_rope_inplace(q, k, indptr, offsets)   # theta 1e4, NeoX
indptr = torch.tensor([0, 1, 5, 10], dtype=torch.int32)
offsets = torch.tensor([4, 6, 3], dtype=torch.int32)
positions = rope_compat.positions_from_offsets(indptr, offsets, num_tokens=nnz)
assert positions.tolist() == [4, 6, 7, 8, 9, 3, 4, 5, 6, 7]
q = torch.randn(nnz, Hq, D, dtype=torch.bfloat16)
k = torch.randn(nnz, Hk, D, dtype=torch.bfloat16)
q0, k0 = q.clone(), k.clone()
cache = flashinfer_cache(D, max_position=64, rope_scale=1.0, rope_theta=1e4)
rope_compat.rotary_embedding(positions, q, k, D, cache, True)
check("ragged: q", q, rope64(q0, positions, D, default_freqs(D, 1e4), True))
check("ragged: k", k, rope64(k0, positions, D, default_freqs(D, 1e4), True))
print("flashinfer apply_rope_inplace(indptr, offsets) -> positions_from_offsets + rotary_embedding: OK")

# 4. Llama 3.1 scaling.
#    FlashInfer: flashinfer.apply_llama31_rope_pos_ids_inplace(q, k, pos_ids, rope_scale=8,
#                    rope_theta=5e5, low_freq_factor=1, high_freq_factor=4, old_context_len=8192)
llama31 = {
    "rope_type": "llama3",
    "factor": 8.0,  # rope_scale
    "rope_theta": 5e5,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,  # old_context_len
}
pos_ids = torch.randint(0, 131072, (nnz,))
cache = rope_compat.compute_cos_sin_cache(D, 131072, llama31)
q = torch.randn(nnz, Hq, D, dtype=torch.bfloat16)
k = torch.randn(nnz, Hk, D, dtype=torch.bfloat16)
q0, k0 = q.clone(), k.clone()
rope_compat.apply_rope_with_cos_sin_cache_inplace(pos_ids, q, k, D, cache, is_neox=True)
# FlashInfer's kernel form of Llama 3.1: blend the scaled and unscaled frequency with a
# weight that is linear in the frequency, clamped to [0, 1].
f = default_freqs(D, 5e5)
smooth = (8192 * f / (2 * math.pi * (4.0 - 1.0)) - 1.0 / (4.0 / 1.0 - 1.0)).clamp(0, 1)
freqs = (1 - smooth) * f / 8.0 + smooth * f
check("llama31: q", q, rope64(q0, pos_ids, D, freqs, True))
check("llama31: k", k, rope64(k0, pos_ids, D, freqs, True))
print("flashinfer apply_llama31_rope_pos_ids_inplace -> llama3 cache + cache API: OK")
