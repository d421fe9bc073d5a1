// The CPU kernel of the rotary ops (rope, batched rope, rope with the KV-cache store), and its Python binding (the module rope_compat._cpu).
//
// The same binding as the CUDA module's (binding.h: plain CPython functions, errors raised
// as Python exceptions, never as C++ exceptions; see ops.cpp for why) and the same checks
// (checks.h), so every message reads as the Python checks' do. rope_compat/ops/cpu.py
// registers `launch` as the CPU kernel of the ops, and the eager CPU path of
// rope_compat.rotary_embedding calls it directly (no dispatcher round trip).
//
// Semantics are the Torch implementation's (rope_compat/ops/torch_impl.py): float32 math
// whatever the dtypes, rounded once to q/k's dtype; a position (plus its offset, for the
// batched op) outside [0, cache rows) raises IndexError before anything is written.
//
// The work:
// 1. bounds: the min and max cache row over all tokens (one read of positions; in parallel
//    only for very large calls, where it is still a small fraction of the rotation);
// 2. rotation: (token, head) items, q's heads then k's for each token, split over threads by
//    at::parallel_for (small calls run on the calling thread). Per token the cache row is
//    converted to float32 once (sin negated for inverse) into a stack buffer shared by its
//    heads; a float32 cache read forward is used in place. Each step rotates 2 * W pairs
//    (W = float32 lanes of at::vec::Vectorized): NeoX reads the halves' vectors directly,
//    GPT-J de-interleaves 4 * W elements into x and y vectors and interleaves them back.
//    Tails use masked (count) loads and stores: no element outside the rotated dims is
//    read or written.
// 3. rotary_embedding_set_kv only: the KV-cache store, (token, kv head) items in parallel.
// No allocation per call (at::parallel_for's OpenMP region aside).
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "binding.h"
#include "checks.h"

#define ROPE_STR2(x) #x
#define ROPE_STR(x) ROPE_STR2(x)
#ifndef CPU_CAPABILITY
#define CPU_CAPABILITY DEFAULT
#endif
#ifndef ROPE_CPU_CAPABILITY  // what setup.py compiled for: CPU_CAPABILITY, or AVX512_BF16
#define ROPE_CPU_CAPABILITY CPU_CAPABILITY
#endif

namespace rope_compat {
namespace {

using at::vec::Vectorized;
using Vec = Vectorized<float>;
constexpr int kW = Vec::size();
constexpr int kStep = 2 * kW;  // pairs per step; also the lanes of Vectorized<BFloat16/Half>
// Pairs of a cache row converted at a time (a 8 KiB stack buffer of cos and sin).
constexpr int kSegment = 1024;

// Loads n (0 < n, at most kStep used) elements of T as float32 into a (first W) and b.
template <typename T>
struct Io;

template <>
struct Io<float> {
  static inline void load(const float* p, int n, Vec& a, Vec& b) {
    if (n >= kStep) {
      a = Vec::loadu(p);
      b = Vec::loadu(p + kW);
      return;
    }
    a = Vec::loadu(p, std::min(n, kW));
    b = n > kW ? Vec::loadu(p + kW, n - kW) : Vec(0.f);
  }
  static inline void store(float* p, int n, const Vec& a, const Vec& b) {
    if (n >= kStep) {
      a.store(p);
      b.store(p + kW);
      return;
    }
    a.store(p, std::min(n, kW));
    if (n > kW) b.store(p + kW, n - kW);
  }
};

template <typename T>
struct IoReduced {  // c10::BFloat16, c10::Half: one Vectorized<T> holds kStep elements
  using V = Vectorized<T>;
  static_assert(V::size() == kStep, "reduced-float vectors hold two float vectors");
  static inline void load(const T* p, int n, Vec& a, Vec& b) {
    const V v = n >= kStep ? V::loadu(p) : V::loadu(p, n);
    std::tie(a, b) = at::vec::convert_to_float<T>(v);
  }
  static inline void store(T* p, int n, const Vec& a, const Vec& b) {
    const V v = at::vec::convert_from_float<T>(a, b);
    if (n >= kStep) {
      v.store(p);
    } else {
      v.store(p, n);
    }
  }
};
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
// With AVX512-BF16 (built so where the building CPU has it): the conversion to bfloat16 in one
// instruction (round to nearest even, as at::vec's), 2x faster bf16 rotation than at::vec's
// integer rounding sequence. The instruction flushes float32 denormals to zero; a vector with
// one (|x| < FLT_MIN, x != 0: never a rope output of ordinary inputs) takes at::vec's exact path.
template <>
struct Io<c10::BFloat16> : IoReduced<c10::BFloat16> {
  static inline void store(c10::BFloat16* p, int n, const Vec& a, const Vec& b) {
    const __m512 tiny = _mm512_set1_ps(std::numeric_limits<float>::min());
    const __m512 abs_a = _mm512_abs_ps(a), abs_b = _mm512_abs_ps(b);
    const __mmask16 sub_a = _mm512_cmp_ps_mask(abs_a, tiny, _CMP_LT_OQ) & _mm512_cmp_ps_mask(abs_a, _mm512_setzero_ps(), _CMP_NEQ_OQ);
    const __mmask16 sub_b = _mm512_cmp_ps_mask(abs_b, tiny, _CMP_LT_OQ) & _mm512_cmp_ps_mask(abs_b, _mm512_setzero_ps(), _CMP_NEQ_OQ);
    if (__builtin_expect((sub_a | sub_b) != 0, 0)) return IoReduced<c10::BFloat16>::store(p, n, a, b);
    const __m512i v = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
    if (n >= kStep) {
      _mm512_storeu_si512(p, v);
    } else {
      _mm512_mask_storeu_epi16(p, (__mmask32)((uint64_t{1} << n) - 1), v);
    }
  }
};
#else
template <>
struct Io<c10::BFloat16> : IoReduced<c10::BFloat16> {};
#endif
template <>
struct Io<c10::Half> : IoReduced<c10::Half> {};

// x*c - y*s and y*c + x*s, as the Torch implementation computes them (float32).
inline void rotate_pair(Vec& x, Vec& y, const Vec& c, const Vec& s) {
  const Vec xs = x * s;
  x = at::vec::fmsub(x, c, y * s);
  y = at::vec::fmadd(y, c, xs);
}

// NeoX: pairs (x[i], x[half + i]) for i in [0, n), with cos/sin float32 for those pairs.
template <typename T>
inline void rotate_neox(T* x, int64_t half, const float* cos, const float* sin, int64_t n) {
  T* y = x + half;
  for (int64_t i = 0; i < n; i += kStep) {
    const int m = static_cast<int>(std::min<int64_t>(kStep, n - i));
    Vec x0, x1, y0, y1, c0, c1, s0, s1;
    Io<T>::load(x + i, m, x0, x1);
    Io<T>::load(y + i, m, y0, y1);
    Io<float>::load(cos + i, m, c0, c1);
    Io<float>::load(sin + i, m, s0, s1);
    rotate_pair(x0, y0, c0, s0);
    rotate_pair(x1, y1, c1, s1);
    Io<T>::store(x + i, m, x0, x1);
    Io<T>::store(y + i, m, y0, y1);
  }
}

// GPT-J: pairs (x[2i], x[2i + 1]) for i in [0, n).
template <typename T>
inline void rotate_gptj(T* x, const float* cos, const float* sin, int64_t n) {
  for (int64_t i = 0; i < n; i += kStep) {
    const int m = static_cast<int>(std::min<int64_t>(kStep, n - i));  // pairs this step
    T* p = x + 2 * i;
    Vec v0, v1, v2 = Vec(0.f), v3 = Vec(0.f), c0, c1, s0, s1;
    Io<T>::load(p, std::min(2 * m, kStep), v0, v1);
    if (m > kW) Io<T>::load(p + kStep, 2 * m - kStep, v2, v3);
    Io<float>::load(cos + i, m, c0, c1);
    Io<float>::load(sin + i, m, s0, s1);
    auto [xa, ya] = at::vec::deinterleave2(v0, v1);  // pairs [0, W)
    auto [xb, yb] = at::vec::deinterleave2(v2, v3);  // pairs [W, 2W)
    rotate_pair(xa, ya, c0, s0);
    rotate_pair(xb, yb, c1, s1);
    std::tie(v0, v1) = at::vec::interleave2(xa, ya);
    Io<T>::store(p, std::min(2 * m, kStep), v0, v1);
    if (m > kW) {
      std::tie(v2, v3) = at::vec::interleave2(xb, yb);
      Io<T>::store(p + kStep, 2 * m - kStep, v2, v3);
    }
  }
}

inline int64_t read_index(const void* p, bool is64, int64_t t) {
  return is64 ? static_cast<const int64_t*>(p)[t] : static_cast<const int32_t*>(p)[t];
}

// The cache row of token t: positions[t] (+ offsets[t]), in int64 (an int32 sum could wrap;
// an int64 one wraps as the Torch implementation's does).
inline int64_t cache_row(const RotaryParams& p, int64_t t) {
  const int64_t pos = read_index(p.positions, p.positions_int64, t);
  if (p.cache_offsets == nullptr) return pos;
  const uint64_t sum = static_cast<uint64_t>(pos) +
                       static_cast<uint64_t>(read_index(p.cache_offsets, p.offsets_int64, t));
  return static_cast<int64_t>(sum);
}

// IndexError naming positions, with the message of checks.check_positions_in_range.
std::optional<Failure> check_bounds(const RotaryParams& p) {
  using MinMax = std::pair<int64_t, int64_t>;
  const MinMax ident{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  const MinMax mm = at::parallel_reduce(
      int64_t{0}, static_cast<int64_t>(p.num_tokens), int64_t{1} << 18, ident,
      [&](int64_t b, int64_t e, MinMax acc) {
        for (int64_t t = b; t < e; ++t) {
          const int64_t r = cache_row(p, t);
          acc.first = std::min(acc.first, r);
          acc.second = std::max(acc.second, r);
        }
        return acc;
      },
      [](MinMax a, MinMax b) { return MinMax{std::min(a.first, b.first), std::max(a.second, b.second)}; });
  if (mm.first < 0 || mm.second >= p.cache_rows) {
    return fail(PyExc_IndexError, "positions: cache rows must lie in [0, ", p.cache_rows, "), got values in [",
                mm.first, ", ", mm.second, "]");
  }
  return std::nullopt;
}

// Cache row elements [i0, i0 + n) of cos and sin as float32 (sin negated for inverse).
template <typename C>
inline void row_to_float(const C* cos, const C* sin, int64_t n, bool inverse, float* out_cos, float* out_sin) {
  const float sign = inverse ? -1.f : 1.f;
  for (int64_t i = 0; i < n; ++i) {
    out_cos[i] = static_cast<float>(cos[i]);
    out_sin[i] = sign * static_cast<float>(sin[i]);
  }
}

template <typename T, typename C>
void rotate_all(const RotaryParams& p) {
  const int64_t hq = p.num_heads, hk = p.key ? p.num_kv_heads : 0, heads = hq + hk;
  const int64_t half = p.rot_dim / 2;
  const int64_t seq = p.seq_len;
  T* const q = static_cast<T*>(p.query);
  T* const k = static_cast<T*>(p.key);
  const C* const cache = static_cast<const C*>(p.cache);
  // A float32 cache read forward needs no conversion: cos/sin are read in place.
  constexpr bool kInPlace = std::is_same_v<C, float>;
  const bool in_place = kInPlace && !p.inverse;
  // Items of at least ~16K rotated elements per thread: below that the fork costs more.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / p.rot_dim);
  at::parallel_for(int64_t{0}, p.num_tokens * heads, grain, [&](int64_t begin, int64_t end) {
    alignas(64) float cos_buf[kSegment];
    alignas(64) float sin_buf[kSegment];
    int64_t t = begin / heads, h = begin % heads;
    for (int64_t item = begin; item < end; ++t, h = 0) {
      const int64_t h_end = std::min(heads, h + (end - item));
      item += h_end - h;
      const int64_t b = t / seq, s = t % seq;
      T* const q_tok = q + b * p.q_batch_stride + s * p.q_token_stride + p.rope_dim_offset;
      T* const k_tok = k ? k + b * p.k_batch_stride + s * p.k_token_stride + p.rope_dim_offset : nullptr;
      const C* const row = cache + cache_row(p, t) * p.cache_row_stride;
      for (int64_t i0 = 0; i0 < half; i0 += kSegment) {
        const int64_t n = std::min<int64_t>(kSegment, half - i0);
        const float* cos;
        const float* sin;
        if (in_place) {
          cos = reinterpret_cast<const float*>(row) + i0;
          sin = reinterpret_cast<const float*>(row) + half + i0;
        } else {
          row_to_float(row + i0, row + half + i0, n, p.inverse, cos_buf, sin_buf);
          cos = cos_buf;
          sin = sin_buf;
        }
        for (int64_t j = h; j < h_end; ++j) {
          T* const x = j < hq ? q_tok + j * p.q_head_stride : k_tok + (j - hq) * p.k_head_stride;
          if (p.is_neox) {
            rotate_neox(x + i0, half, cos, sin, n);
          } else {
            rotate_gptj(x + 2 * i0, cos, sin, n);
          }
        }
      }
    }
  });
}

template <typename T>
void rotate_by_cache(const RotaryParams& p) {
  switch (p.cache_dtype) {
    case DType::kFloat32: return rotate_all<T, float>(p);
    case DType::kFloat16: return rotate_all<T, c10::Half>(p);
    case DType::kBFloat16: return rotate_all<T, c10::BFloat16>(p);
    case DType::kFloat64: return rotate_all<T, double>(p);
  }
}

void rotate(const RotaryParams& p) {
  switch (p.dtype) {
    case DType::kFloat32: return rotate_by_cache<float>(p);
    case DType::kFloat16: return rotate_by_cache<c10::Half>(p);
    case DType::kBFloat16: return rotate_by_cache<c10::BFloat16>(p);
    case DType::kFloat64: return;  // refused by the checks
  }
}

// ---- The KV-cache store of rotary_embedding_set_kv, after the rotation: token t's rotated key
// and its value, every head and dim, to row cache_loc[t] of k_buffer / v_buffer where that row
// exists (kv_store.py). Stored = float32(x) / scale, rounded once to the buffer dtype.

template <typename T, typename B>
inline void store_head(const T* src, B* dst, int64_t n, float scale) {
  if constexpr (std::is_same_v<T, B>) {
    if (scale == 1.f) {
      std::copy(src, src + n, dst);
      return;
    }
  }
  if (scale == 1.f) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<B>(static_cast<float>(src[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<B>(static_cast<float>(src[i]) / scale);
  }
}

template <typename T, typename B>
void store_all(const RotaryParams& p, const KvStoreParams& s) {
  const int64_t hk = p.num_kv_heads, seq = p.seq_len, head_size = s.head_size;
  const T* const k = static_cast<const T*>(p.key);
  const T* const v = static_cast<const T*>(s.value);
  B* const k_buf = static_cast<B*>(s.k_buffer);
  B* const v_buf = static_cast<B*>(s.v_buffer);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / (2 * head_size));
  at::parallel_for(int64_t{0}, p.num_tokens * hk, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / hk, h = item % hk, b = t / seq, i = t % seq;
      const int64_t loc = read_index(s.cache_loc, s.loc_int64, t);
      if (loc >= 0 && loc < s.k_rows) {
        store_head(k + b * p.k_batch_stride + i * p.k_token_stride + h * p.k_head_stride,
                   k_buf + loc * s.k_row_stride + h * s.k_head_stride, head_size, s.k_scale);
      }
      if (loc >= 0 && loc < s.v_rows) {
        store_head(v + b * s.v_batch_stride + i * s.v_token_stride + h * s.v_head_stride,
                   v_buf + loc * s.v_row_stride + h * s.v_head_stride_buf, head_size, s.v_scale);
      }
    }
  });
}

template <typename T>
void store_by_buffer(const RotaryParams& p, const KvStoreParams& s) {
  switch (s.buffer_dtype) {
    case BufferDType::kFloat32: return store_all<T, float>(p, s);
    case BufferDType::kFloat16: return store_all<T, c10::Half>(p, s);
    case BufferDType::kBFloat16: return store_all<T, c10::BFloat16>(p, s);
    case BufferDType::kFloat64: return store_all<T, double>(p, s);
    case BufferDType::kFloat8E4M3: return store_all<T, c10::Float8_e4m3fn>(p, s);
    case BufferDType::kFloat8E5M2: return store_all<T, c10::Float8_e5m2>(p, s);
  }
}

void store(const RotaryParams& p, const KvStoreParams& s) {
  switch (p.dtype) {
    case DType::kFloat32: return store_by_buffer<float>(p, s);
    case DType::kFloat16: return store_by_buffer<c10::Half>(p, s);
    case DType::kBFloat16: return store_by_buffer<c10::BFloat16>(p, s);
    case DType::kFloat64: return;  // refused by the checks
  }
}

std::optional<Failure> run(const Tensor& positions, const Tensor& query, const Tensor* key, int64_t head_size,
                           const Tensor& cache, bool is_neox, int64_t rope_dim_offset, bool inverse,
                           const Tensor* offsets, const StoreArgs* store) {
  RotaryParams p{};
  KvStoreParams sp{};
  RETURN_IF_FAILED(check_rotary(positions, query, key, head_size, cache, is_neox, rope_dim_offset, inverse, offsets,
                                store, c10::DeviceType::CPU, "the compiled CPU kernel takes CPU tensors only", p,
                                sp));
  if (p.num_tokens == 0) return std::nullopt;
  RETURN_IF_FAILED(check_bounds(p));  // before anything is written, the store included
  rotate(p);
  if (store != nullptr) rope_compat::store(p, sp);
  return std::nullopt;
}

PyMethodDef methods[] = {
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(launch<run>)), METH_FASTCALL,
     "launch(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0, inverse=False)\n"
     "Check the arguments and rotate query and key in place (CPU tensors)."},
    {"batched_launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(batched_launch<run>)),
     METH_FASTCALL,
     "batched_launch(positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim, cos_sin_cache_offsets)\n"
     "vLLM's former multi-LoRA op: rows offsets[t] + positions[t]."},
    {"set_kv_launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_kv_launch<run>)), METH_FASTCALL,
     "set_kv_launch(positions, query, key, head_size, cos_sin_cache, is_neox, value, k_buffer, v_buffer, cache_loc,\n"
     "k_scale=None, v_scale=None, rope_dim_offset=0)\n"
     "Rotate query and key, then store the key and value at rows cache_loc of k_buffer/v_buffer."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_cpu", "rope-compat CPU kernel", -1, methods};

}  // namespace
}  // namespace rope_compat

PyMODINIT_FUNC PyInit__cpu() {
  PyObject* m = PyModule_Create(&rope_compat::module_def);
  // The instruction set the kernel was compiled for (setup.py's capability): the loader
  // refuses the module on a CPU that torch finds less capable.
  if (m != nullptr && PyModule_AddStringConstant(m, "cpu_capability", ROPE_STR(ROPE_CPU_CAPABILITY)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
