// The CUDA kernel behind rope_compat::mrope_rotary_embedding: multimodal RoPE in one launch.
//
// The same work units, launch shapes and memory access order as the plain kernel
// (rotary_embedding_kernel.cu and kernel_common.cuh, whose comments give the measurements
// behind them): one token, one group of heads, V rotated pairs per thread; q/k moved with
// 16-byte streaming accesses; cos/sin loaded once per thread and reused for every head of its
// group. What differs is where cos/sin come from: the thread loads the token's three positions
// (temporal, height, width), and each of its V pairs i takes cos/sin from the row of
// section(i). The vector of V pairs is loaded from each row that one of its pairs needs (one
// row for most vectors of the contiguous layout, up to three in the interleaved one) and the
// pairs are picked in registers (mrope_cos_sin), so the cache reads stay vector loads, shared
// by every head.
// Nothing is gathered per call and nothing is allocated.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernel_common.cuh"
#include "mrope.h"
#include "mrope_sections.cuh"

namespace rope_compat {
namespace {

using namespace detail;

struct Launch {
  FastDiv units_per_token, units_per_head;
  int32_t groups, token_begin, token_end;
  int64_t positions_row_stride;
  Sections sec;
};

// The cos/sin of pairs [first, first + N) of a token, as floats. A vector whose pairs all
// share one row (most vectors of the contiguous layout: every one where the section
// boundaries are multiples of N) is one vector load per half, as in the plain kernel; any
// other takes the vector of each row one of its pairs needs, one row at a time, and keeps
// each pair's value from its own row (so at most one row's vector is live besides c/sn).
template <typename CT, int N>
__device__ __forceinline__ void mrope_cos_sin(const CT* cache, int64_t row_stride, const int64_t (&rows)[3],
                                              int32_t first, int32_t half, const Sections& sections,
                                              float (&c)[N], float (&sn)[N]) {
  const int s_first = section_of(sections, first);
  if (!sections.interleaved && s_first == section_of(sections, first + N - 1)) {
    const int64_t row = s_first == 0 ? rows[0] : s_first == 1 ? rows[1] : rows[2];
    const CT* r = cache + row * row_stride + first;
    const Stored<CT, N> cv = *reinterpret_cast<const Stored<CT, N>*>(r);
    const Stored<CT, N> sv = *reinterpret_cast<const Stored<CT, N>*>(r + half);
#pragma unroll
    for (int k = 0; k < N; ++k) c[k] = cv.get(k), sn[k] = sv.get(k);
    return;
  }
  int sec[N];
#pragma unroll
  for (int k = 0; k < N; ++k) sec[k] = section_of(sections, first + k);
#pragma unroll
  for (int s = 0; s < 3; ++s) {
    bool used = false;
#pragma unroll
    for (int k = 0; k < N; ++k) used |= sec[k] == s;
    if (!used) continue;
    const CT* r = cache + rows[s] * row_stride + first;
    const Stored<CT, N> cv = *reinterpret_cast<const Stored<CT, N>*>(r);
    const Stored<CT, N> sv = *reinterpret_cast<const Stored<CT, N>*>(r + half);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (sec[k] == s) c[k] = cv.get(k), sn[k] = sv.get(k);
    }
  }
}

// Several heads per thread: at most 128 registers (two blocks per SM, the plain kernel's
// occupancy), at the price of a few spilled words (ptxas: 60 bytes for bf16 q, float32 cache,
// 2 heads per thread); unbounded, the compiler spends up to 192 on hoisting cos/sin loads,
// which leaves one block per SM. Not yet measured which is faster: build with
// NVCC_APPEND_FLAGS=-DROPE_COMPAT_MROPE_MIN_BLOCKS=1 for the unbounded kernel.
#ifndef ROPE_COMPAT_MROPE_MIN_BLOCKS
#define ROPE_COMPAT_MROPE_MIN_BLOCKS 2
#endif
template <typename T, typename CT, int V, int kHeadsPerBatch>
__global__ void __launch_bounds__(kBlock, kHeadsPerBatch > 1 ? ROPE_COMPAT_MROPE_MIN_BLOCKS : 1)
    mrope_kernel(const RotaryParams p, const Launch l) {
  const uint32_t unit = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t local_token = l.units_per_token.div(unit);
  const int32_t token = l.token_begin + static_cast<int32_t>(local_token);
  if (token >= l.token_end) return;
  const uint32_t rem = unit - local_token * l.units_per_token.d;
  const int32_t group = static_cast<int32_t>(l.units_per_head.div(rem));
  const int32_t j = static_cast<int32_t>(rem - group * l.units_per_head.d);
  const int32_t groups = l.groups;
  pdl_prologue();

  // The three positions first: every cache-row load depends on them.
  int64_t rows[3];
#pragma unroll
  for (int r = 0; r < 3; ++r) rows[r] = load_index(p.positions, p.positions_int64, r * l.positions_row_stride + token);

  const int32_t half = p.rot_dim / 2;
  const bool halves = p.is_neox || (kHeadsPerBatch > 1 && V > 1);
  const int32_t e1 = p.rope_dim_offset + (halves ? j * V : 2 * j * V);
  const int32_t e2 = halves ? e1 + half : e1 + V;

  T* const q_tok = static_cast<T*>(p.query) + token * p.q_token_stride;
  T* const k_tok = p.key == nullptr ? nullptr : static_cast<T*>(p.key) + token * p.k_token_stride;
  const int32_t heads_total = total_heads(p);
  const CT* const cache = static_cast<const CT*>(p.cache);
  // A token with any of its rows outside the cache is left untouched (rows never read).
  const bool in_cache = rows[0] >= 0 && rows[0] < p.cache_rows && rows[1] >= 0 && rows[1] < p.cache_rows &&
                        rows[2] >= 0 && rows[2] < p.cache_rows;

  if constexpr (kHeadsPerBatch == 1) {
    // Small calls, one head per thread: the cache loads go out before the q/k loads.
    if (!in_cache) return;
    T* const head = group < p.num_heads ? q_tok + group * p.q_head_stride
                                        : k_tok + (group - p.num_heads) * p.k_head_stride;
    float c[V], sn[V];
    mrope_cos_sin<CT, V>(cache, p.cache_row_stride, rows, j * V, half, l.sec, c, sn);
    Vec<T, V> x = load_stream<T, V>(head + e1), y = load_stream<T, V>(head + e2);
    if (p.inverse) {
#pragma unroll
      for (int i = 0; i < V; ++i) sn[i] = -sn[i];
    }
    rotate_store<T, V>(head, e1, e2, x, y, c, sn, p.is_neox);
    return;
  }

  // Large calls, kHeadsPerBatch heads per thread: q/k loads first, then the cos/sin.
  float c[V], sn[V];
  bool have_cos_sin = false;
  for (int32_t h0 = group; h0 < heads_total; h0 += kHeadsPerBatch * groups) {
    Vec<T, V> x[kHeadsPerBatch], y[kHeadsPerBatch];
    T* head[kHeadsPerBatch];
#pragma unroll
    for (int m = 0; m < kHeadsPerBatch; ++m) {
      const int32_t h = h0 + m * groups;
      head[m] = h < p.num_heads     ? q_tok + h * p.q_head_stride
                : h < heads_total ? k_tok + (h - p.num_heads) * p.k_head_stride
                                  : nullptr;
      if (head[m] != nullptr) {
        x[m] = load_stream<T, V>(head[m] + e1);
        y[m] = load_stream<T, V>(head[m] + e2);
      }
    }
    if (!have_cos_sin) {
      if (!in_cache) return;
      if (p.is_neox || !halves) {
        mrope_cos_sin<CT, V>(cache, p.cache_row_stride, rows, j * V, half, l.sec, c, sn);
      } else if constexpr (V > 1) {
        // GPT-J over both halves: the pairs of vector j of each half, V / 2 of them each.
        constexpr int kHalfV = V / 2;
        float c0[kHalfV], s0[kHalfV], c1[kHalfV], s1[kHalfV];
        mrope_cos_sin<CT, kHalfV>(cache, p.cache_row_stride, rows, j * kHalfV, half, l.sec, c0, s0);
        mrope_cos_sin<CT, kHalfV>(cache, p.cache_row_stride, rows, half / 2 + j * kHalfV, half, l.sec, c1, s1);
#pragma unroll
        for (int i = 0; i < kHalfV; ++i) {
          c[i] = c0[i], sn[i] = s0[i];
          c[kHalfV + i] = c1[i], sn[kHalfV + i] = s1[i];
        }
      }
      if (p.inverse) {
#pragma unroll
        for (int i = 0; i < V; ++i) sn[i] = -sn[i];
      }
      have_cos_sin = true;
    }
#pragma unroll
    for (int m = 0; m < kHeadsPerBatch; ++m) {
      if (head[m] == nullptr) continue;
      rotate_store<T, V>(head[m], e1, e2, x[m], y[m], c, sn, p.is_neox);
    }
  }
}

// The plain kernel's launch choices (one head per thread for small calls, 2 or 4 heads per
// thread for large ones), with the MRoPE fields.
template <typename T, typename CT, int V>
int launch(const RotaryParams& p, const MropeParams& m, const Target& t) {
  const int32_t units_per_head = p.rot_dim / 2 / V;
  const int32_t heads_total = total_heads(p);
  const int64_t per_thread = heads_per_thread(p, units_per_head, t.device);
  Launch l;
  l.groups = static_cast<int32_t>((heads_total + per_thread - 1) / per_thread);
  l.units_per_token = FastDiv(static_cast<uint32_t>(l.groups * units_per_head));
  l.units_per_head = FastDiv(static_cast<uint32_t>(units_per_head));
  l.positions_row_stride = m.positions_row_stride;
  l.sec = make_sections(m);
  const int64_t per_launch = tokens_per_launch(l.units_per_token.d);
  for (int64_t begin = 0; begin < p.num_tokens; begin += per_launch) {
    l.token_begin = static_cast<int32_t>(begin);
    l.token_end = static_cast<int32_t>(std::min<int64_t>(p.num_tokens, begin + per_launch));
    const int64_t threads = static_cast<int64_t>(l.token_end - l.token_begin) * l.units_per_token.d;
    const cudaError_t err = per_thread == 1      ? launch_pdl(mrope_kernel<T, CT, V, 1>, threads, t, p, l)
                            : units_per_head >= 8 ? launch_pdl(mrope_kernel<T, CT, V, 2>, threads, t, p, l)
                                                  : launch_pdl(mrope_kernel<T, CT, V, 4>, threads, t, p, l);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  return 0;
}

template <typename T, typename CT>
int dispatch_width(const RotaryParams& p, const MropeParams& m, const Target& t) {
  switch (call_width<T>(p)) {
    case 8:
      if constexpr (sizeof(T) == 2) return launch<T, CT, 8>(p, m, t);
      break;
    case 4: return launch<T, CT, 4>(p, m, t);
    case 2: return launch<T, CT, 2>(p, m, t);
    default: break;
  }
  return launch<T, CT, 1>(p, m, t);
}

template <typename T>
int dispatch_cache(const RotaryParams& p, const MropeParams& m, const Target& t) {
  switch (p.cache_dtype) {
    case DType::kFloat32: return dispatch_width<T, float>(p, m, t);
    case DType::kFloat16: return dispatch_width<T, __half>(p, m, t);
    case DType::kBFloat16: return dispatch_width<T, __nv_bfloat16>(p, m, t);
    case DType::kFloat64: return dispatch_width<T, double>(p, m, t);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace

int launch_mrope_rotary_embedding(const RotaryParams& p, const MropeParams& m, void* stream, int device) {
  if (p.num_tokens == 0) return 0;
  const Target s{static_cast<cudaStream_t>(stream), device};
  switch (p.dtype) {
    case DType::kFloat32: return dispatch_cache<float>(p, m, s);
    case DType::kFloat16: return dispatch_cache<__half>(p, m, s);
    case DType::kBFloat16: return dispatch_cache<__nv_bfloat16>(p, m, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace rope_compat
