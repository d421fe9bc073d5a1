// Which position row (temporal, height, width) drives rotated pair i of multimodal RoPE: device
// code shared by the MRoPE kernel (mrope_kernel.cu) and the MRoPE variant of the fused KV-store
// kernel (fused_kv_store_kernel.cu). The rules are ops/mrope.py's.
#pragma once

#include <cstdint>

#include "mrope.h"

namespace rope_compat {

// Contiguous [0, s0) t, [s0, s0 + s1) h, the rest w; interleaved h where i % 3 == 1 and
// i < 3 * s1, w where i % 3 == 2 and i < 3 * s2, t elsewhere.
struct Sections {
  int32_t t_end, h_end;    // contiguous: s0, s0 + s1
  int32_t h_lim, w_lim;    // interleaved: 3 * s1, 3 * s2
  bool interleaved;
};

inline Sections make_sections(const MropeParams& m) {
  Sections s;
  s.t_end = m.section[0];
  s.h_end = m.section[0] + m.section[1];
  s.h_lim = 3 * m.section[1];
  s.w_lim = 3 * m.section[2];
  s.interleaved = m.interleaved;
  return s;
}

__device__ __forceinline__ int section_of(const Sections& s, int32_t i) {
  if (!s.interleaved) return (i >= s.t_end) + (i >= s.h_end);
  const int32_t r = i % 3;
  return (r == 1 && i < s.h_lim) ? 1 : (r == 2 && i < s.w_lim) ? 2 : 0;
}

}  // namespace rope_compat
