// The CUDA kernel behind rope_compat::mrope_rotary_embedding: multimodal RoPE in one launch.
//
// The same work units and launch shapes as the plain kernel (rotary_embedding_kernel.cu and
// kernel_common.cuh, whose comments give the measurements behind them): one token, one group
// of heads, V rotated pairs per thread; q/k moved with 16-byte streaming accesses; cos/sin
// loaded once per thread and reused for every head of its group. What differs is where cos/sin
// come from: the thread loads the token's three positions (temporal, height, width), and each
// of its V pairs i takes cos/sin from the row of section(i) (MropeCosSin: two vector loads from
// one row where the call's sections allow, else one scalar load per pair from its own row).
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

template <typename T, typename CT, int V, int kHeadsPerBatch, bool kGather, bool kQkFirst = false>
__global__ void __launch_bounds__(kBlock) mrope_kernel(const RotaryParams p, const Launch l) {
  static_assert(!kQkFirst || kHeadsPerBatch == 1, "q/k first: the one-head kernels only");
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
    // Small calls, one head per thread. In a call of one wave (kQkFirst) the q/k loads go out
    // first, before the positions arrive, and the cache loads behind them: waiting for three
    // positions before any q/k load measured slower, for per-pair (kGather) and one-row loads
    // alike, although the plain kernel, with one position, prefers its row first. In larger
    // calls (1.2 waves of the per-pair kernel) q/k first measured slower (benchmarks/README.md,
    // MRoPE).
    T* const head = group < p.num_heads ? q_tok + group * p.q_head_stride
                                        : k_tok + (group - p.num_heads) * p.k_head_stride;
    MropeCosSin<CT, V, kGather> cs;
    Vec<T, V> x, y;
    if constexpr (kQkFirst) {
      x = load_stream<T, V>(head + e1), y = load_stream<T, V>(head + e2);
      if (in_cache) cs.load(cache, p.cache_row_stride, rows, j * V, half, l.sec);
    } else {
      if (!in_cache) return;
      cs.load(cache, p.cache_row_stride, rows, j * V, half, l.sec);
      x = load_stream<T, V>(head + e1), y = load_stream<T, V>(head + e2);
    }
    float c[V], sn[V];
    rotation_floats<V>(cs, p.inverse, c, sn, in_cache);
    if constexpr (kQkFirst) {
      // Every path stores, a token outside the cache its loaded bits unchanged: the compiler
      // moves a load whose value one path never uses below the branch to the other path, where
      // it would wait for the positions again. No branch, no such move.
      Vec<T, V> rx = x, ry = y;
      rotate<T, V>(rx, ry, c, sn, p.is_neox);
      store_stream<T, V>(head + e1, in_cache ? rx : x);
      store_stream<T, V>(head + e2, in_cache ? ry : y);
      return;
    }
    rotate_store<T, V>(head, e1, e2, x, y, c, sn, p.is_neox);
    return;
  }

  // Large calls, kHeadsPerBatch heads per thread: the cache loads go out first, the first
  // batch's q/k loads next, and only then are the cos/sin converted. (The plain kernel issues
  // its q/k loads first; here, holding the first batch's q/k in registers while the per-pair
  // loads were issued took up to 158 registers, and that order measured 1.4x slower on
  // interleaved sections at 8192-32768 tokens, the same on contiguous ones:
  // benchmarks/studies/results/mrope_vs_plain.txt.) The thread's V pairs are loaded as two
  // runs of V / 2: for NeoX [jV, jV + V/2) and [jV + V/2, jV + V); for GPT-J over both halves
  // the pairs of vector j of each half.
  if (!in_cache) return;
  constexpr int kLo = V > 1 ? V / 2 : 1;
  MropeCosSin<CT, kLo, kGather> lo, hi;
  const int32_t lo_first = halves && !p.is_neox ? j * kLo : j * V;
  const int32_t hi_first = halves && !p.is_neox ? half / 2 + j * kLo : j * V + kLo;
  lo.load(cache, p.cache_row_stride, rows, lo_first, half, l.sec);
  if constexpr (V > 1) hi.load(cache, p.cache_row_stride, rows, hi_first, half, l.sec);
  float c[V], sn[V];
  bool have_cos_sin = false;
  for (int32_t h0 = group; h0 < heads_total; h0 += kHeadsPerBatch * groups) {
    Vec<T, V> x[kHeadsPerBatch], y[kHeadsPerBatch];
    T* head[kHeadsPerBatch];
    load_heads<T, V, kHeadsPerBatch>(p, q_tok, k_tok, heads_total, h0, groups, e1, e2, head, x, y);
    if (!have_cos_sin) {
      const float sign = p.inverse ? -1.f : 1.f;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        c[i] = i < kLo ? lo.cos(i) : hi.cos(i - kLo);
        sn[i] = sign * (i < kLo ? lo.sin(i) : hi.sin(i - kLo));
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

template <typename T, typename CT, int V, bool kGather>
cudaError_t launch_kernel(int64_t per_thread, int32_t units_per_head, int64_t threads, const Target& t,
                          const RotaryParams& p, const Launch& l) {
  if (per_thread == 1) {
    if (threads <= resident_threads(t.device)) return launch_pdl(mrope_kernel<T, CT, V, 1, kGather, true>, threads, t, p, l);
    return launch_pdl(mrope_kernel<T, CT, V, 1, kGather>, threads, t, p, l);
  }
  return units_per_head >= 8 ? launch_pdl(mrope_kernel<T, CT, V, 2, kGather>, threads, t, p, l)
                             : launch_pdl(mrope_kernel<T, CT, V, 4, kGather>, threads, t, p, l);
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
  const bool gather = needs_gather(l.sec, V);
  const int64_t per_launch = tokens_per_launch(l.units_per_token.d);
  for (int64_t begin = 0; begin < p.num_tokens; begin += per_launch) {
    l.token_begin = static_cast<int32_t>(begin);
    l.token_end = static_cast<int32_t>(std::min<int64_t>(p.num_tokens, begin + per_launch));
    const int64_t threads = static_cast<int64_t>(l.token_end - l.token_begin) * l.units_per_token.d;
    cudaError_t err;
    if constexpr (V > 1) {
      err = gather ? launch_kernel<T, CT, V, true>(per_thread, units_per_head, threads, t, p, l)
                   : launch_kernel<T, CT, V, false>(per_thread, units_per_head, threads, t, p, l);
    } else {
      err = launch_kernel<T, CT, V, false>(per_thread, units_per_head, threads, t, p, l);
    }
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
