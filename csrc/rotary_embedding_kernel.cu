// The CUDA kernel behind rope_compat::rotary_embedding.
//
// Work unit: one token, one group of heads, V rotated pairs. A thread loads the
// token's position once, the V cos and V sin values once, and reuses them for every head of
// its group (q heads first, then k heads), so the cache is read once per token and unit.
// Only the rotated dims are touched: pass-through dims are never read or written.
//
// Memory-level parallelism is what makes this op fast: once a thread has its position, it
// issues its cache-row loads and the q/k loads of kHeadsPerBatch heads (two vectors each)
// before it waits on any of them, so their latencies overlap.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernel_common.cuh"
#include "rotary_embedding.h"

namespace rope_compat {
namespace {

using namespace detail;

struct Launch {
  FastDiv units_per_token, units_per_head, seq_len;
  int32_t groups, token_begin, token_end;
};

template <typename T, typename CT, int V, int kHeadsPerBatch>
__global__ void __launch_bounds__(kBlock)
    rotary_kernel(const RotaryParams p, const Launch l) {
  const uint32_t unit = blockIdx.x * blockDim.x + threadIdx.x;  // < 2^31: the host splits launches
  const uint32_t local_token = l.units_per_token.div(unit);
  const int32_t token = l.token_begin + static_cast<int32_t>(local_token);
  if (token >= l.token_end) return;
  const uint32_t rem = unit - local_token * l.units_per_token.d;
  const int32_t group = static_cast<int32_t>(l.units_per_head.div(rem));
  const int32_t j = static_cast<int32_t>(rem - group * l.units_per_head.d);
  const int32_t groups = l.groups;
  pdl_prologue();

  // The position first: the cache-row load depends on it.
  int64_t row = load_index(p.positions, p.positions_int64, token);
  if (p.cache_offsets != nullptr) row += load_index(p.cache_offsets, p.offsets_int64, token);

  const int32_t half = p.rot_dim / 2;
  // The two vectors of V elements this unit rotates, as element offsets within a head: vector j
  // of each half of the rotated dims (NeoX pairs (i, i + half); GPT-J pairs (2i, 2i + 1) within
  // each vector), or for GPT-J in small calls the adjacent vectors 2j and 2j + 1.
  //   Why GPT-J changes with the call size: with adjacent vectors a warp's store covers each
  // 32-byte sector only half, so L2 takes every sector twice, which costs bandwidth in large
  // calls. Small calls are latency-bound, and there adjacent vectors win: each load instruction
  // asks for whole 128-byte lines. Which one a call gets follows from its launch: one head per
  // thread means adjacent vectors (see launch()).
  const bool halves = p.is_neox || (kHeadsPerBatch > 1 && V > 1);
  const int32_t e1 = p.rope_dim_offset + (halves ? j * V : 2 * j * V);
  const int32_t e2 = halves ? e1 + half : e1 + V;

  const int32_t b = static_cast<int32_t>(l.seq_len.div(token));
  const int32_t s = token - b * p.seq_len;
  T* const q_tok = static_cast<T*>(p.query) + b * p.q_batch_stride + s * p.q_token_stride;
  T* const k_tok = p.key == nullptr
                       ? nullptr
                       : static_cast<T*>(p.key) + b * p.k_batch_stride + s * p.k_token_stride;
  const int32_t heads_total = total_heads(p);

  if constexpr (kHeadsPerBatch == 1) {
    // Small calls, one head per thread (head `group`): the cache-row loads go out before the
    // q/k loads. The row has the longest latency (a random row of a large table); issued after
    // the q/k loads it would add its latency to theirs
    // (benchmarks/studies/results/h200_load_order.txt). Nothing uses the row before the q/k loads
    // are issued, or the thread would wait for it there (benchmarks/studies/sass_waits.py shows
    // where it waits): it is converted, and the inverse rotation's sign applied, in the arithmetic.
    if (row < 0 || row >= p.cache_rows) return;  // rows outside the cache are never read
    CosSinRow<CT, V> cs;
    cs.load(static_cast<const CT*>(p.cache) + row * p.cache_row_stride + j * V, half);
    T* const head = group < p.num_heads ? q_tok + group * p.q_head_stride
                                        : k_tok + (group - p.num_heads) * p.k_head_stride;
    Vec<T, V> x = load_stream<T, V>(head + e1), y = load_stream<T, V>(head + e2);
    float c[V], sn[V];
    rotation_floats<V>(cs, p.inverse, c, sn);
    rotate_store<T, V>(head, e1, e2, x, y, c, sn, p.is_neox);
    return;
  }

  // Large calls, kHeadsPerBatch heads per thread: their q/k loads go out first, then the row;
  // there bandwidth, not one load's latency, sets the time, and this order measured faster.
  float c[V], sn[V];
  bool have_cos_sin = false;
  for (int32_t h0 = group; h0 < heads_total; h0 += kHeadsPerBatch * groups) {
    Vec<T, V> x[kHeadsPerBatch], y[kHeadsPerBatch];
    T* head[kHeadsPerBatch];
    load_heads<T, V, kHeadsPerBatch>(p, q_tok, k_tok, heads_total, h0, groups, e1, e2, head, x, y);
    if (!have_cos_sin) {
      // Rows outside the cache are never read: such a token is left untouched.
      if (row < 0 || row >= p.cache_rows) return;
      const CT* cache_row = static_cast<const CT*>(p.cache) + row * p.cache_row_stride;
      if (p.is_neox || !halves) {
        load_cos_sin<CT, V>(cache_row + j * V, half, c, sn);
      } else if constexpr (V > 1) {
        // GPT-J over both halves: the pairs of vector j of each half, V / 2 of them each.
        constexpr int kHalfV = V / 2;
        float c0[kHalfV], s0[kHalfV], c1[kHalfV], s1[kHalfV];
        load_cos_sin<CT, kHalfV>(cache_row + j * kHalfV, half, c0, s0);
        load_cos_sin<CT, kHalfV>(cache_row + half / 2 + j * kHalfV, half, c1, s1);
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

template <typename T, typename CT, int V>
int launch(const RotaryParams& p, const Target& t) {
  const int32_t units_per_head = p.rot_dim / 2 / V;
  const int32_t heads_total = total_heads(p);
  // 1 or 4 heads per thread (heads_per_thread gives the rule). Of the 4, how many have loads in
  // flight at once: 2 for whole 128-dim heads (8+ units a head), whose loads are already wide,
  // and 4 for 64 rotated dims (4 units a head); more measured slower in both cases.
  const int64_t per_thread = heads_per_thread(p, units_per_head, t.device);
  Launch l;
  l.groups = static_cast<int32_t>((heads_total + per_thread - 1) / per_thread);
  l.units_per_token = FastDiv(static_cast<uint32_t>(l.groups * units_per_head));
  l.units_per_head = FastDiv(static_cast<uint32_t>(units_per_head));
  l.seq_len = FastDiv(static_cast<uint32_t>(p.seq_len));
  const int64_t per_launch = tokens_per_launch(l.units_per_token.d);
  for (int64_t begin = 0; begin < p.num_tokens; begin += per_launch) {
    l.token_begin = static_cast<int32_t>(begin);
    l.token_end = static_cast<int32_t>(std::min<int64_t>(p.num_tokens, begin + per_launch));
    const int64_t threads = static_cast<int64_t>(l.token_end - l.token_begin) * l.units_per_token.d;
    const cudaError_t err = per_thread == 1      ? launch_pdl(rotary_kernel<T, CT, V, 1>, threads, t, p, l)
                            : units_per_head >= 8 ? launch_pdl(rotary_kernel<T, CT, V, 2>, threads, t, p, l)
                                                  : launch_pdl(rotary_kernel<T, CT, V, 4>, threads, t, p, l);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  return 0;
}

template <typename T, typename CT>
int dispatch_width(const RotaryParams& p, const Target& t) {
  switch (call_width<T>(p)) {
    case 8:
      if constexpr (sizeof(T) == 2) return launch<T, CT, 8>(p, t);
      break;
    case 4: return launch<T, CT, 4>(p, t);
    case 2: return launch<T, CT, 2>(p, t);
    default: break;
  }
  return launch<T, CT, 1>(p, t);
}

template <typename T>
int dispatch_cache(const RotaryParams& p, const Target& t) {
  switch (p.cache_dtype) {
    case DType::kFloat32: return dispatch_width<T, float>(p, t);
    case DType::kFloat16: return dispatch_width<T, __half>(p, t);
    case DType::kBFloat16: return dispatch_width<T, __nv_bfloat16>(p, t);
    case DType::kFloat64: return dispatch_width<T, double>(p, t);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace

int vector_width(const RotaryParams& p) {
  const int es = element_size(p.dtype), ces = element_size(p.cache_dtype);
  const int32_t half = p.rot_dim / 2;
  for (int v = 16 / es; v > 1; v /= 2) {
    const int64_t a = static_cast<int64_t>(v) * es;               // q/k vector bytes
    const int64_t ca = std::min<int64_t>(16, static_cast<int64_t>(v) * ces);  // cache
    bool ok = half % v == 0 && p.rope_dim_offset % v == 0 && aligned(p.query, a) &&
              (p.q_batch_stride * es) % a == 0 && (p.q_token_stride * es) % a == 0 &&
              (p.q_head_stride * es) % a == 0 && aligned(p.cache, ca) &&
              (p.cache_row_stride * ces) % ca == 0 && (half * ces) % ca == 0;
    if (p.key != nullptr) {
      ok = ok && aligned(p.key, a) && (p.k_batch_stride * es) % a == 0 &&
           (p.k_token_stride * es) % a == 0 && (p.k_head_stride * es) % a == 0;
    }
    if (ok) return v;
  }
  return 1;
}

int launch_rotary_embedding(const RotaryParams& p, void* stream, int device) {
  if (p.num_tokens == 0) return 0;
  const Target s{static_cast<cudaStream_t>(stream), device};
  switch (p.dtype) {
    case DType::kFloat32: return dispatch_cache<float>(p, s);
    case DType::kFloat16: return dispatch_cache<__half>(p, s);
    case DType::kBFloat16: return dispatch_cache<__nv_bfloat16>(p, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace rope_compat
