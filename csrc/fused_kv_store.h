// The interface of rope with the KV-cache store (rope_compat::rotary_embedding_set_kv): the
// rotation's RotaryParams plus where token t's rotated key and value go, row cache_loc[t] of
// k_buffer / v_buffer. Like rotary_embedding.h, no torch types: raw pointers and strides.
#pragma once

#include <cstdint>

#include "rotary_embedding.h"

namespace rope_compat {

enum class BufferDType : int32_t {
  kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3, kFloat8E4M3 = 4, kFloat8E5M2 = 5
};

struct KvStoreParams {
  const void* value;      // the key's dtype, laid out like the key
  void* k_buffer;         // rows of [num_kv_heads, head_size]
  void* v_buffer;
  const void* cache_loc;  // [num_tokens], contiguous; rows outside [0, rows) are not stored
  int64_t v_batch_stride, v_token_stride, v_head_stride;
  int64_t k_rows, k_row_stride, k_head_stride;  // k_buffer, in elements
  int64_t v_rows, v_row_stride, v_head_stride_buf;  // v_buffer, in elements
  int32_t head_size;
  float k_scale, v_scale;  // stored = x / scale; 1 when no scale is given
  float k_inv_scale, v_inv_scale;  // 1 / scale, rounded to nearest
  BufferDType buffer_dtype;
  bool loc_int64;
};

// One launch (or one per 2^31 threads) on `stream` of CUDA device `device`: rotates query and
// key as launch_rotary_embedding does (p.key must be set) and stores the key and value rows.
// Returns a cudaError_t value, 0 on success.
int launch_rotary_set_kv(const RotaryParams& p, const KvStoreParams& s, void* stream, int device);

}  // namespace rope_compat
