// The interface of multimodal RoPE (rope_compat::mrope_rotary_embedding): the rotation's
// RotaryParams (positions = the temporal row, cache_offsets unused) plus where the height and
// width rows are and which pairs each row drives. No torch types, as rotary_embedding.h.
#pragma once

#include <cstdint>

#include "fused_kv_store.h"
#include "rotary_embedding.h"

namespace rope_compat {

struct MropeParams {
  int64_t positions_row_stride;  // elements from the temporal row to the height row, and on to width
  int32_t section[3];            // pairs of each row; they sum to rot_dim / 2
  bool interleaved;              // Qwen3-VL: t h w t h w ... (see ops/mrope.py), else contiguous
};

// One launch (or one per 2^31 threads) on `stream` of CUDA device `device`: pair i of token t
// rotates by cache row positions[section(i) * positions_row_stride + t]; a token with a row
// outside the cache is left untouched. Returns a cudaError_t value, 0 on success.
int launch_mrope_rotary_embedding(const RotaryParams& p, const MropeParams& m, void* stream, int device);

// mrope_rotary_embedding_set_kv: the rotation above (p.key must be set), then token t's rotated
// key and value stored at row cache_loc[t] as launch_rotary_set_kv does; one launch (or one per
// 2^31 threads). A token with a row outside the cache is stored unrotated. A cudaError_t, 0 on success.
int launch_mrope_set_kv(const RotaryParams& p, const KvStoreParams& s, const MropeParams& m, void* stream,
                        int device);

}  // namespace rope_compat
