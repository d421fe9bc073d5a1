// The interface between the op's host code (ops.cpp, which sees torch) and the CUDA kernel
// (rotary_embedding_kernel.cu, which sees only raw pointers and strides). Keeping torch out
// of the .cu file keeps nvcc's work small and the kernel independent of torch's ABI.
#pragma once

#include <cstdint>

namespace rope_compat {

enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

struct RotaryParams {
  const void* positions;      // [num_tokens], contiguous
  const void* cache_offsets;  // [num_tokens] or nullptr (batched multi-LoRA rows)
  void* query;
  void* key;  // nullptr when there is no key
  const void* cache;
  // Token t lives at (t / seq_len) * batch_stride + (t % seq_len) * token_stride, in elements.
  int64_t q_batch_stride, q_token_stride, q_head_stride;
  int64_t k_batch_stride, k_token_stride, k_head_stride;
  int64_t cache_rows, cache_row_stride;
  int32_t num_tokens, seq_len;
  int32_t num_heads, num_kv_heads;
  int32_t rot_dim, rope_dim_offset;
  DType dtype, cache_dtype;
  bool positions_int64, offsets_int64;
  bool is_neox, inverse;
};

// Elements per vector access (1, 2, 4 or 8) that every pointer and stride allows.
int vector_width(const RotaryParams& p);

// Launches the kernel on `stream` (a cudaStream_t) of CUDA device `device`, the current one.
// Returns a cudaError_t value, 0 on success.
int launch_rotary_embedding(const RotaryParams& p, void* stream, int device);

}  // namespace rope_compat
