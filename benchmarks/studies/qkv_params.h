// The launch parameters of the layout the studies time, as an engine calls RoPE: bf16 q and k
// are views into one fused qkv tensor [T, (hq + 2 * hk) * d] (q heads, then k, then v heads),
// the cache is float32 with rows of `rot` values, positions are int64 [T]. For the studies that
// link a kernel of csrc/ and call it through its header, as the extension does.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "rotary_embedding.h"

inline rope_compat::RotaryParams fused_qkv_params(__nv_bfloat16* qkv, const int64_t* positions, const float* cache,
                                                  int64_t cache_rows, int tokens, int hq, int hk, int d, int rot,
                                                  bool neox) {
  const int64_t row = static_cast<int64_t>(hq + 2 * hk) * d;
  rope_compat::RotaryParams p{};
  p.positions = positions;
  p.query = qkv;
  p.key = qkv + static_cast<int64_t>(hq) * d;
  p.cache = cache;
  p.q_batch_stride = p.k_batch_stride = row * tokens;
  p.q_token_stride = p.k_token_stride = row;
  p.q_head_stride = p.k_head_stride = d;
  p.cache_rows = cache_rows;
  p.cache_row_stride = rot;
  p.num_tokens = p.seq_len = tokens;
  p.num_heads = hq;
  p.num_kv_heads = hk;
  p.rot_dim = rot;
  p.dtype = rope_compat::DType::kBFloat16;
  p.cache_dtype = rope_compat::DType::kFloat32;
  p.positions_int64 = true;
  p.is_neox = neox;
  return p;
}
