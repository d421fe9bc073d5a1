// Which position row (temporal, height, width) drives rotated pair i of multimodal RoPE, and
// the loads of each pair's cos/sin from its row: device code shared by the MRoPE kernel
// (mrope_kernel.cu) and the MRoPE variant of the fused KV-store kernel
// (fused_kv_store_kernel.cu). The rules are ops/mrope.py's.
#pragma once

#include <cstdint>

#include "kernel_common.cuh"
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

// Whether a call with vectors of v pairs needs one load per pair (MropeCosSin<..., true>): the
// interleaved layout, or a section boundary inside a vector. Otherwise every vector lies in one
// section and is loaded from one row. (The several-heads rotation kernels load runs of v / 2
// pairs at multiples of v / 2, which a boundary at a multiple of v never splits either.)
inline bool needs_gather(const Sections& s, int v) {
  return v > 1 && (s.interleaved || s.t_end % v != 0 || s.h_end % v != 0);
}

__device__ __forceinline__ int section_of(const Sections& s, int32_t i) {
  if (!s.interleaved) return (i >= s.t_end) + (i >= s.h_end);
  const int32_t r = i % 3;
  return (r == 1 && i < s.h_lim) ? 1 : (r == 2 && i < s.w_lim) ? 2 : 0;
}

namespace detail {

// The cos/sin of pairs [first, first + N) of a token, loaded before anything uses them: they
// are converted to float (cos(k), sin(k)) only after the thread has issued its q/k loads, so
// that no load waits for another (see the plain kernel's load order).
//   kGather false, one row: every vector of the call lies in one section (contiguous layout,
// section boundaries multiples of the vector), so the thread picks its row and loads two
// vectors from it, as the plain kernel does.
//   kGather true, one row per pair (interleaved layout, or boundaries inside a vector): each
// pair is a scalar load from the row of its section, the row picked before the load rather
// than the value after it. Loading the vector of every row a pair needs and selecting in
// registers took three rows' worth of registers (spills in the several-heads kernels) and
// made the selection wait for all of them.
template <typename CT, int N, bool kGather>
struct MropeCosSin;

template <typename CT, int N>
struct MropeCosSin<CT, N, false> : CosSinRow<CT, N> {
  __device__ __forceinline__ void load(const CT* cache, int64_t row_stride, const int64_t (&rows)[3],
                                       int32_t first, int32_t half, const Sections& sec) {
    const int sid = section_of(sec, first);
    CosSinRow<CT, N>::load(cache + (sid == 0 ? rows[0] : sid == 1 ? rows[1] : rows[2]) * row_stride + first, half);
  }
};

template <typename CT, int N>
struct MropeCosSin<CT, N, true> {
  CT c[N], s[N];
  __device__ __forceinline__ void load(const CT* cache, int64_t row_stride, const int64_t (&rows)[3],
                                       int32_t first, int32_t half, const Sections& sec) {
    // Pair first + k sits k elements past `first` in its row: an immediate offset of each load.
    const CT* base[3];
#pragma unroll
    for (int r = 0; r < 3; ++r) base[r] = cache + rows[r] * row_stride + first;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int sid = section_of(sec, first + k);
      const CT* r = sid == 0 ? base[0] : sid == 1 ? base[1] : base[2];
      c[k] = r[k];
      s[k] = r[half + k];
    }
  }
  __device__ __forceinline__ float cos(int k) const { return to_float(c[k]); }
  __device__ __forceinline__ float sin(int k) const { return to_float(s[k]); }
};

}  // namespace detail
}  // namespace rope_compat
