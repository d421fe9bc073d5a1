// The CUDA kernel behind rope_compat::rotary_embedding_set_kv: rope plus the KV-cache store in
// one launch.
//
// Work units of a token, one thread each, V elements per access:
//   rotation units   (q heads, then k heads) x (rot_dim / 2 / V): two vectors of one head are
//                    rotated in registers and stored back; for a k head the same registers
//                    are also stored to row cache_loc[t] of k_buffer (converted, / k_scale);
//   pass-through units  k heads x ((head_size - rot_dim) / V): the unrotated dims of the key,
//                    copied to k_buffer;
//   value units      k heads x (head_size / V): the value copied to v_buffer (/ v_scale).
// So the rotated key is never read back from memory, and every byte moves once. Neighbouring
// threads take neighbouring vectors of a head, so each warp access is contiguous. Large calls
// into buffers that are not float8 give a rotation or value thread 4 heads instead of one
// (set_kv_grouped_kernel).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "fused_kv_store.h"
#include "kernel_common.cuh"
#include "mrope.h"
#include "mrope_sections.cuh"

namespace rope_compat {
namespace {

using namespace detail;

struct SetKvLaunch {
  FastDiv units_per_token, rot_units_per_head, pass_units_per_head, value_units_per_head, seq_len;
  int32_t rot_units, pass_units;  // per token: rotation units, then pass-through units
  int32_t groups, value_groups;    // set_kv_grouped_kernel: head groups of the rotation and of the value
  int32_t token_begin, token_end;
  // MRoPE (kMrope kernels only): positions [3, T] rows this far apart, and the pairs of each row.
  int64_t positions_row_stride;
  Sections sec;
};

// float8 buffer elements, as their bits.
struct E4M3 {
  uint8_t bits;
};
struct E5M2 {
  uint8_t bits;
};

// Rounded once, to nearest even; float8 without saturation (out of range: NaN for e4m3,
// infinity for e5m2), as torch's conversion.
template <typename B>
__device__ __forceinline__ B convert(float x);
template <>
__device__ __forceinline__ float convert<float>(float x) { return x; }
template <>
__device__ __forceinline__ double convert<double>(float x) { return static_cast<double>(x); }
template <>
__device__ __forceinline__ __half convert<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 convert<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
// float8 through the hardware's saturating conversion, two values per instruction (the
// non-saturating conversion has no instruction and is emulated, which made a float8 store slower
// than a bf16 one), then torch's overflow rules restored: e4m3fn has no infinity, so anything
// that rounds above 448 (|x| > 464) is NaN; e5m2 rounds |x| >= 61440 to infinity. NaN stays NaN,
// sign kept.
__device__ __forceinline__ uint8_t e4m3_fixup(uint8_t bits, float x) {
  return fabsf(x) <= 464.f ? bits : static_cast<uint8_t>(0x7f | (signbit(x) ? 0x80 : 0));
}
__device__ __forceinline__ uint8_t e5m2_fixup(uint8_t bits, float x) {
  const uint8_t sign = signbit(x) ? 0x80 : 0;
  if (x != x) return 0x7f | sign;
  return fabsf(x) >= 61440.f ? static_cast<uint8_t>(0x7c | sign) : bits;
}
template <>
__device__ __forceinline__ E4M3 convert<E4M3>(float x) {
  return E4M3{e4m3_fixup(static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)), x)};
}
template <>
__device__ __forceinline__ E5M2 convert<E5M2>(float x) {
  return E5M2{e5m2_fixup(static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2)), x)};
}

// Two values at once: one instruction for both where the buffer is float8.
template <typename B>
__device__ __forceinline__ void convert2(float a, float b, B& oa, B& ob) {
  oa = convert<B>(a);
  ob = convert<B>(b);
}
template <>
__device__ __forceinline__ void convert2<E4M3>(float a, float b, E4M3& oa, E4M3& ob) {
  const __nv_fp8x2_storage_t two = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  oa.bits = e4m3_fixup(static_cast<uint8_t>(two & 0xff), a);
  ob.bits = e4m3_fixup(static_cast<uint8_t>(two >> 8), b);
}
template <>
__device__ __forceinline__ void convert2<E5M2>(float a, float b, E5M2& oa, E5M2& ob) {
  const __nv_fp8x2_storage_t two = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E5M2);
  oa.bits = e5m2_fixup(static_cast<uint8_t>(two & 0xff), a);
  ob.bits = e5m2_fixup(static_cast<uint8_t>(two >> 8), b);
}

// x / scale for buffers of 16 bits or fewer, without a division (a division per element costs
// a float8 store more than its bytes do): x * inv (inv = 1 / scale rounded to nearest, from the
// host) corrected by one fused multiply-add. That is the correctly rounded x / scale wherever
// it is a normal float (Markstein's theorem); where it is not (below 2^-126, or past the float
// range) such buffers round both to the same value. copysignf keeps the sign of a zero
// quotient (-0 / s is -0; the correction adds +0). Right wherever x * inv is finite.
__device__ __forceinline__ float finite_quotient(float x, float scale, float inv) {
  const float q = x * inv;
  return copysignf(__fmaf_rn(__fmaf_rn(-q, scale, x), inv, q), q);
}

template <typename B>
constexpr bool kFloat8 = std::is_same_v<B, E4M3> || std::is_same_v<B, E5M2>;

// The float8 bytes of V values (V a multiple of 4) for the common case, in fewer instructions
// than store_row's general path (they run after the thread's last load, at the end of its
// chain): finite_quotient, the saturating conversion, four bytes to a word. Returns nonzero
// when any byte is one the general path may change: saturated or at the largest finite value,
// or NaN (which is also what a quotient that is not finite gives here), i.e. low seven bits
// 0x7e-0x7f for e4m3, 0x7b-0x7f for e5m2; the caller then stores nothing from here. For every
// other byte both paths compute the same bits.
template <typename B, int V, bool kScaled>
__device__ __forceinline__ uint32_t float8_common(const float (&f)[V], float scale, float inv,
                                                  Vec<uint32_t, V / 4>& out) {
  constexpr __nv_fp8_interpretation_t kKind = std::is_same_v<B, E4M3> ? __NV_E4M3 : __NV_E5M2;
  constexpr uint32_t kToTopBit = std::is_same_v<B, E4M3> ? 0x02020202u : 0x05050505u;
  uint32_t special = 0;
#pragma unroll
  for (int w = 0; w < V / 4; ++w) {
    float a[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a[i] = kScaled ? finite_quotient(f[4 * w + i], scale, inv) : f[4 * w + i];
    }
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a[0], a[1]), __NV_SATFINITE, kKind);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(a[2], a[3]), __NV_SATFINITE, kKind);
    out.v[w] = lo | hi << 16;
    special |= ((out.v[w] & 0x7f7f7f7fu) + kToTopBit) & 0x80808080u;  // no carry between bytes
  }
  return special;
}

template <typename T, int V>
__device__ __forceinline__ void to_floats(const Vec<T, V>& x, float (&f)[V]) {
#pragma unroll
  for (int i = 0; i < V; ++i) f[i] = to_float(x.v[i]);
}

// Stores x / scale, converted to the buffer type. Without a scale (1) no division is done:
// x / 1 is x exactly, and the branch is the same for the whole launch; a buffer of x's own type
// then takes x's bits as they are, with no round trip through float (which would also make a
// NaN canonical). Buffers of 16 bits or fewer take finite_quotient and its special cases,
// wider ones the division.
// Every KV-row store here (and in store_float8_pair) carries the evict-first hint at every
// width a row takes (float8 rows give 8- and 4-byte vectors), as q/k stores do: this kernel
// never reads the rows back. Against plain stores it measured faster at 1 token and from 8192
// tokens, the same in between (benchmarks/README.md, fused store).
template <typename B, typename T, int V>
__device__ __forceinline__ void store_row(B* dst, const Vec<T, V>& x, float scale, float inv) {
  if constexpr (std::is_same_v<B, T>) {
    if (scale == 1.f) {
      store_evict_first(dst, x);
      return;
    }
  }
  float f[V];
  to_floats(x, f);
  if constexpr (kFloat8<B> && V % 4 == 0) {
    // Two copies, so that the launch-wide branch on the scale is taken once per row.
    Vec<uint32_t, V / 4> out;
    if ((scale != 1.f ? float8_common<B, V, true>(f, scale, inv, out)
                      : float8_common<B, V, false>(f, scale, inv, out)) == 0) {
      store_evict_first(dst, out);
      return;
    }
  }
  if (scale != 1.f) {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if constexpr (sizeof(B) <= 2) {
        // A NaN keeps its own sign (the product's NaN is the device's canonical one), so the
        // store agrees bit for bit with the CPU kernel and with torch on the CPU. Written as
        // selects on comparisons: isfinite/isnan compiled to a branch per element, which made a
        // scaled store of a decode-sized call 0.3-0.4 us slower than an unscaled one.
        const float q = f[i] * inv;
        const float special = f[i] != f[i] ? f[i] : q;  // NaN input: itself; else the inf or NaN product
        f[i] = fabsf(q) < INFINITY ? finite_quotient(f[i], scale, inv) : special;
      } else {
        f[i] = f[i] / scale;
      }
    }
  }
  Vec<B, V> out;
  if constexpr (V % 2 == 0) {
#pragma unroll
    for (int i = 0; i < V; i += 2) convert2<B>(f[i], f[i + 1], out.v[i], out.v[i + 1]);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out.v[i] = convert<B>(f[i]);
  }
  store_evict_first(dst, out);
}

// The two vectors of a rotated key into a float8 buffer. Both are converted before the one
// check of the common case, so that their conversions overlap at the end of the thread's chain
// instead of following each other, which measured faster at decode sizes (benchmarks/README.md,
// fused store). Where either has a special byte, each goes through store_row.
template <typename B, typename T, int V>
__device__ __forceinline__ void store_float8_pair(B* d1, B* d2, const Vec<T, V>& x, const Vec<T, V>& y,
                                                  float scale, float inv) {
  if constexpr (V % 4 == 0) {
    float fx[V], fy[V];
    to_floats(x, fx);
    to_floats(y, fy);
    Vec<uint32_t, V / 4> ox, oy;
    const uint32_t special = scale != 1.f ? float8_common<B, V, true>(fx, scale, inv, ox) |
                                                float8_common<B, V, true>(fy, scale, inv, oy)
                                          : float8_common<B, V, false>(fx, scale, inv, ox) |
                                                float8_common<B, V, false>(fy, scale, inv, oy);
    if (special == 0) {
      store_evict_first(d1, ox);
      store_evict_first(d2, oy);
      return;
    }
  }
  store_row<B, T, V>(d1, x, scale, inv);
  store_row<B, T, V>(d2, y, scale, inv);
}

// A pass-through vector of the key (unit r of its token, past the rotation units): copied from
// the key to its k_buffer row, one head a thread in both kernels.
template <typename T, typename B, int V>
__device__ __forceinline__ void store_pass_through(const RotaryParams& p, const KvStoreParams& s, const SetKvLaunch& l,
                                                   T* k_tok, int64_t loc, int32_t r) {
  if (loc < 0 || loc >= s.k_rows) return;
  const int32_t u = r - l.rot_units;
  const int32_t h = static_cast<int32_t>(l.pass_units_per_head.div(u));
  int32_t e = (u - h * static_cast<int32_t>(l.pass_units_per_head.d)) * V;
  if (e >= p.rope_dim_offset) e += p.rot_dim;
  const Vec<T, V> x = load_stream<T, V>(k_tok + h * p.k_head_stride + e);
  store_row<B, T, V>(static_cast<B*>(s.k_buffer) + loc * s.k_row_stride + h * s.k_head_stride + e, x, s.k_scale,
                     s.k_inv_scale);
}

// kMrope: the MRoPE op (mrope_rotary_embedding_set_kv). positions is the temporal row of
// [3, T] (seq_len = T), and pair i takes its cos/sin from the row of its section (kGather: one
// scalar load per pair; else two vectors from one row, where no section boundary falls inside
// a vector, as in mrope_kernel.cu); everything else, the store included, is the plain op's.
template <typename T, typename B, typename CT, int V, bool kMrope, bool kRowFirst, bool kGather = false>
__global__ void __launch_bounds__(kBlock) set_kv_kernel(const RotaryParams p, const KvStoreParams s,
                                                        const SetKvLaunch l) {
  static_assert(!kMrope || !kRowFirst, "MRoPE: q/k first at every size");
  const uint32_t unit = blockIdx.x * blockDim.x + threadIdx.x;  // < 2^31: the host splits launches
  const uint32_t local_token = l.units_per_token.div(unit);
  const int32_t token = l.token_begin + static_cast<int32_t>(local_token);
  if (token >= l.token_end) return;
  const int32_t r = static_cast<int32_t>(unit - local_token * l.units_per_token.d);
  pdl_prologue();

  const int64_t loc = load_index(s.cache_loc, s.loc_int64, token);
  const int32_t b = static_cast<int32_t>(l.seq_len.div(token));
  const int32_t t = token - b * p.seq_len;
  T* const k_tok = static_cast<T*>(p.key) + b * p.k_batch_stride + t * p.k_token_stride;

  if (r < l.rot_units) {
    int64_t rows[3];
    const auto load_rows = [&] {
      rows[0] = rows[1] = rows[2] = load_index(p.positions, p.positions_int64, token);
      if constexpr (kMrope) {
        rows[1] = load_index(p.positions, p.positions_int64, l.positions_row_stride + token);
        rows[2] = load_index(p.positions, p.positions_int64, 2 * l.positions_row_stride + token);
      }
    };
    if constexpr (!kMrope) load_rows();
    const int32_t h = static_cast<int32_t>(l.rot_units_per_head.div(r));
    const int32_t j = r - h * static_cast<int32_t>(l.rot_units_per_head.d);
    const bool is_key = h >= p.num_heads;
    T* const head = is_key ? k_tok + (h - p.num_heads) * p.k_head_stride
                           : static_cast<T*>(p.query) + b * p.q_batch_stride + t * p.q_token_stride +
                                 h * p.q_head_stride;
    const int32_t half = p.rot_dim / 2;
    // NeoX pairs (i, i + half): vector j of each half. GPT-J pairs (2i, 2i + 1): vectors 2j, 2j + 1.
    const int32_t e1 = p.rope_dim_offset + (p.is_neox ? j * V : 2 * j * V);
    const int32_t e2 = p.is_neox ? e1 + half : e1 + V;
    Vec<T, V> x, y;
    const auto load_qk = [&] { x = load_stream<T, V>(head + e1), y = load_stream<T, V>(head + e2); };
    if constexpr (kMrope) {  // q/k before the three positions (see the load order below)
      load_qk();
      load_rows();
    }
    // A position outside the cache (for MRoPE, any of the three) leaves the token unrotated
    // (as the rotary kernels do); its key is still stored as it is.
    bool in_cache = true;
#pragma unroll
    for (int i = 0; i < (kMrope ? 3 : 1); ++i) in_cache = in_cache && rows[i] >= 0 && rows[i] < p.cache_rows;
    // Load order. kRowFirst (calls of one wave, where latency sets the time): the thread waits
    // for its position, then issues the cache loads and only then the q/k loads, as the plain
    // kernel's one-head path does; the rows end the longest chain (position, then row), and
    // issued behind the q/k loads they waited for them. Larger calls are bandwidth-bound: there
    // the q/k loads go out first, before the position arrives, which measured faster.
    // MRoPE issues its q/k loads first at every size: with three positions to wait for, that
    // measured faster in calls of one wave too, as in mrope_kernel.cu (benchmarks/README.md,
    // MRoPE). Either way the cos/sin are converted only where the arithmetic needs them.
    std::conditional_t<kMrope, MropeCosSin<CT, V, kGather>, CosSinRow<CT, V>> cs;
    const CT* const cache = static_cast<const CT*>(p.cache);
    const auto issue_cos_sin = [&] {  // kept as stored (not detail::load_cos_sin, which converts)
      if constexpr (kMrope) {
        cs.load(cache, p.cache_row_stride, rows, j * V, half, l.sec);
      } else {
        cs.load(cache + rows[0] * p.cache_row_stride + j * V, half);
      }
    };
    if constexpr (!kMrope && !kRowFirst) load_qk();
    if (in_cache) issue_cos_sin();
    if constexpr (kRowFirst) load_qk();
    if (in_cache) {
      float c[V], sn[V];
      rotation_floats<V>(cs, p.inverse, c, sn);
      rotate_store<T, V>(head, e1, e2, x, y, c, sn, p.is_neox);
    }
    if (is_key && loc >= 0 && loc < s.k_rows) {
      B* const dst = static_cast<B*>(s.k_buffer) + loc * s.k_row_stride + (h - p.num_heads) * s.k_head_stride;
      if constexpr (kFloat8<B>) {
        store_float8_pair<B, T, V>(dst + e1, dst + e2, x, y, s.k_scale, s.k_inv_scale);
      } else {
        store_row<B, T, V>(dst + e1, x, s.k_scale, s.k_inv_scale);
        store_row<B, T, V>(dst + e2, y, s.k_scale, s.k_inv_scale);
      }
    }
    return;
  }
  if (r < l.rot_units + l.pass_units) {
    store_pass_through<T, B, V>(p, s, l, k_tok, loc, r);
    return;
  }
  if (loc < 0 || loc >= s.v_rows) return;  // a vector of the value
  const int32_t u = r - l.rot_units - l.pass_units;
  const int32_t h = static_cast<int32_t>(l.value_units_per_head.div(u));
  const int32_t e = (u - h * static_cast<int32_t>(l.value_units_per_head.d)) * V;
  const T* const v_head = static_cast<const T*>(s.value) + b * s.v_batch_stride + t * s.v_token_stride +
                          h * s.v_head_stride;
  const Vec<T, V> x = load_stream<T, V>(v_head + e);
  store_row<B, T, V>(static_cast<B*>(s.v_buffer) + loc * s.v_row_stride + h * s.v_head_stride_buf + e, x,
                     s.v_scale, s.v_inv_scale);
}

// Large calls into buffers that are not float8 (see launch()): kHeads heads per thread instead of
// one, as the plain kernel's large calls do, so that each thread has more loads in flight behind
// one position and one cos/sin row. A rotation thread takes heads g, g + groups, ... (q heads,
// then k heads), kBatch of them loaded at once; a value thread takes heads vg, vg + value_groups,
// ..., all loaded before any is stored. Pass-through vectors stay one head a thread
// (store_pass_through). Same results as set_kv_kernel, element for element.
template <typename T, typename B, typename CT, int V, int kBatch>
__global__ void __launch_bounds__(kBlock) set_kv_grouped_kernel(const RotaryParams p, const KvStoreParams s,
                                                                const SetKvLaunch l) {
  static_assert(!kFloat8<B>, "float8 rows are stored in pairs by set_kv_kernel");
  constexpr int kHeads = 4;
  const uint32_t unit = blockIdx.x * blockDim.x + threadIdx.x;  // < 2^31: the host splits launches
  const uint32_t local_token = l.units_per_token.div(unit);
  const int32_t token = l.token_begin + static_cast<int32_t>(local_token);
  if (token >= l.token_end) return;
  const int32_t r = static_cast<int32_t>(unit - local_token * l.units_per_token.d);
  pdl_prologue();

  const int64_t loc = load_index(s.cache_loc, s.loc_int64, token);
  const int32_t b = static_cast<int32_t>(l.seq_len.div(token));
  const int32_t t = token - b * p.seq_len;
  T* const k_tok = static_cast<T*>(p.key) + b * p.k_batch_stride + t * p.k_token_stride;

  if (r < l.rot_units) {
    const int64_t row = load_index(p.positions, p.positions_int64, token);
    const bool in_cache = row >= 0 && row < p.cache_rows;
    const int32_t g = static_cast<int32_t>(l.rot_units_per_head.div(r));
    const int32_t j = r - g * static_cast<int32_t>(l.rot_units_per_head.d);
    const int32_t half = p.rot_dim / 2;
    const int32_t e1 = p.rope_dim_offset + (p.is_neox ? j * V : 2 * j * V);
    const int32_t e2 = p.is_neox ? e1 + half : e1 + V;
    const int32_t heads_total = p.num_heads + p.num_kv_heads;
    T* const q_tok = static_cast<T*>(p.query) + b * p.q_batch_stride + t * p.q_token_stride;
    const bool store_key = loc >= 0 && loc < s.k_rows;
    B* const k_row = static_cast<B*>(s.k_buffer) + loc * s.k_row_stride;
    float c[V], sn[V];
    bool have_cos_sin = false;
#pragma unroll 1
    for (int32_t h0 = g; h0 < heads_total; h0 += kBatch * l.groups) {
      Vec<T, V> x[kBatch], y[kBatch];
      T* head[kBatch];
      load_heads<T, V, kBatch>(p, q_tok, k_tok, heads_total, h0, l.groups, e1, e2, head, x, y);
      if (!have_cos_sin && in_cache) {
        CosSinRow<CT, V> cs;
        cs.load(static_cast<const CT*>(p.cache) + row * p.cache_row_stride + j * V, half);
        rotation_floats<V>(cs, p.inverse, c, sn);
      }
      have_cos_sin = true;
#pragma unroll
      for (int m = 0; m < kBatch; ++m) {
        if (head[m] == nullptr) continue;
        if (in_cache) rotate_store<T, V>(head[m], e1, e2, x[m], y[m], c, sn, p.is_neox);
        const int32_t kh = h0 + m * l.groups - p.num_heads;
        if (kh >= 0 && store_key) {
          B* const dst = k_row + kh * s.k_head_stride;
          store_row<B, T, V>(dst + e1, x[m], s.k_scale, s.k_inv_scale);
          store_row<B, T, V>(dst + e2, y[m], s.k_scale, s.k_inv_scale);
        }
      }
    }
    return;
  }
  if (r < l.rot_units + l.pass_units) {
    store_pass_through<T, B, V>(p, s, l, k_tok, loc, r);
    return;
  }
  if (loc < 0 || loc >= s.v_rows) return;  // value vectors of kHeads heads
  const int32_t u = r - l.rot_units - l.pass_units;
  const int32_t vg = static_cast<int32_t>(l.value_units_per_head.div(u));
  const int32_t e = (u - vg * static_cast<int32_t>(l.value_units_per_head.d)) * V;
  const T* const v_tok = static_cast<const T*>(s.value) + b * s.v_batch_stride + t * s.v_token_stride;
  Vec<T, V> x[kHeads];
#pragma unroll
  for (int m = 0; m < kHeads; ++m) {
    const int32_t h = vg + m * l.value_groups;
    if (h < p.num_kv_heads) x[m] = load_stream<T, V>(v_tok + h * s.v_head_stride + e);
  }
  B* const v_row = static_cast<B*>(s.v_buffer) + loc * s.v_row_stride + e;
#pragma unroll
  for (int m = 0; m < kHeads; ++m) {
    const int32_t h = vg + m * l.value_groups;
    if (h < p.num_kv_heads) store_row<B, T, V>(v_row + h * s.v_head_stride_buf, x[m], s.v_scale, s.v_inv_scale);
  }
}

template <typename T, typename B, typename CT, int V>
cudaError_t launch_grouped(int32_t rot_per_head, int64_t threads, const Target& target, const RotaryParams& p,
                           const KvStoreParams& s, const SetKvLaunch& l) {
  if constexpr (kFloat8<B>) {
    return cudaErrorInvalidValue;  // not reached: launch() keeps float8 buffers at one head a thread
  } else {
    // How many of a thread's 4 heads have loads in flight at once: the plain kernel's rule.
    return rot_per_head >= 8 ? launch_pdl(set_kv_grouped_kernel<T, B, CT, V, 2>, threads, target, p, s, l)
                             : launch_pdl(set_kv_grouped_kernel<T, B, CT, V, 4>, threads, target, p, s, l);
  }
}

template <typename T, typename B, typename CT, int V>
int launch(const RotaryParams& p, const KvStoreParams& s, const MropeParams* m, cudaStream_t stream, int device) {
  const int32_t rot_per_head = p.rot_dim / 2 / V;
  const int32_t pass_per_head = (s.head_size - p.rot_dim) / V;
  const int32_t value_per_head = s.head_size / V;
  SetKvLaunch l;
  l.rot_units = (p.num_heads + p.num_kv_heads) * rot_per_head;
  l.pass_units = p.num_kv_heads * pass_per_head;
  int64_t per_token = static_cast<int64_t>(l.rot_units) + l.pass_units +
                      static_cast<int64_t>(p.num_kv_heads) * value_per_head;
  // Large plain calls take several heads per thread (set_kv_grouped_kernel) from the plain
  // kernel's threshold, 8 threads at one head each per thread the GPU holds at once. Float8
  // buffers keep one head per thread, where they measured faster (benchmarks/README.md). MRoPE
  // keeps one head per thread.
  const int64_t resident = resident_threads(device);
  const bool grouped = m == nullptr && !kFloat8<B> &&
                       static_cast<int64_t>(p.num_tokens) * per_token >= 8 * resident;
  if (grouped) {
    l.groups = (p.num_heads + p.num_kv_heads + 3) / 4;
    l.value_groups = (p.num_kv_heads + 3) / 4;
    l.rot_units = l.groups * rot_per_head;
    per_token = static_cast<int64_t>(l.rot_units) + l.pass_units + static_cast<int64_t>(l.value_groups) * value_per_head;
  }
  l.units_per_token = FastDiv(static_cast<uint32_t>(per_token));
  l.rot_units_per_head = FastDiv(static_cast<uint32_t>(rot_per_head));
  l.pass_units_per_head = FastDiv(static_cast<uint32_t>(std::max(pass_per_head, 1)));
  l.value_units_per_head = FastDiv(static_cast<uint32_t>(value_per_head));
  l.seq_len = FastDiv(static_cast<uint32_t>(p.seq_len));
  l.positions_row_stride = m ? m->positions_row_stride : 0;
  l.sec = m ? make_sections(*m) : Sections{};
  const bool gather = m && needs_gather(l.sec, V);
  const Target target{stream, device};
  const int64_t per_launch = tokens_per_launch(per_token);
  for (int64_t begin = 0; begin < p.num_tokens; begin += per_launch) {
    l.token_begin = static_cast<int32_t>(begin);
    l.token_end = static_cast<int32_t>(std::min<int64_t>(p.num_tokens, begin + per_launch));
    const int64_t threads = static_cast<int64_t>(l.token_end - l.token_begin) * per_token;
    const bool row_first = threads <= resident;
    cudaError_t err;
    if (m) {
      err = gather ? launch_pdl(set_kv_kernel<T, B, CT, V, true, false, true>, threads, target, p, s, l)
                   : launch_pdl(set_kv_kernel<T, B, CT, V, true, false, false>, threads, target, p, s, l);
    } else if (grouped) {
      err = launch_grouped<T, B, CT, V>(rot_per_head, threads, target, p, s, l);
    } else {
      err = row_first ? launch_pdl(set_kv_kernel<T, B, CT, V, false, true>, threads, target, p, s, l)
                      : launch_pdl(set_kv_kernel<T, B, CT, V, false, false>, threads, target, p, s, l);
    }
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  return 0;
}

int buffer_element_size(BufferDType t) {
  switch (t) {
    case BufferDType::kFloat32: return 4;
    case BufferDType::kFloat64: return 8;
    case BufferDType::kFloat16:
    case BufferDType::kBFloat16: return 2;
    default: return 1;
  }
}

// Whether the store side (value, buffers, pass-through dims) allows vectors of v elements; the
// rotation side is vector_width()'s.
bool store_allows(const RotaryParams& p, const KvStoreParams& s, int v) {
  const int64_t a = static_cast<int64_t>(v) * element_size(p.dtype);
  const int64_t ba = static_cast<int64_t>(v) * buffer_element_size(s.buffer_dtype);
  const int64_t bes = buffer_element_size(s.buffer_dtype), es = element_size(p.dtype);
  return s.head_size % v == 0 && p.rot_dim % v == 0 && aligned(s.value, a) && (s.v_batch_stride * es) % a == 0 &&
         (s.v_token_stride * es) % a == 0 && (s.v_head_stride * es) % a == 0 && aligned(s.k_buffer, ba) &&
         aligned(s.v_buffer, ba) && (s.k_row_stride * bes) % ba == 0 && (s.k_head_stride * bes) % ba == 0 &&
         (s.v_row_stride * bes) % ba == 0 && (s.v_head_stride_buf * bes) % ba == 0;
}

template <typename T, typename B, typename CT>
int dispatch_width(const RotaryParams& p, const KvStoreParams& s, const MropeParams* m, cudaStream_t stream,
                   int device) {
  // Two widths only, to keep the number of kernels small: 16-byte q/k/v vectors, or scalars
  // for heads and strides that do not allow them.
  constexpr int kWide = 16 / sizeof(T);
  if (vector_width(p) >= kWide && store_allows(p, s, kWide)) return launch<T, B, CT, kWide>(p, s, m, stream, device);
  return launch<T, B, CT, 1>(p, s, m, stream, device);
}

// The cache type is a template parameter rather than a branch in the kernel: a kernel with all
// four cache loads in it was slower at decode sizes (benchmarks/studies/results/fused_floor.txt).
template <typename T, typename B>
int dispatch_cache(const RotaryParams& p, const KvStoreParams& s, const MropeParams* m, cudaStream_t stream,
                   int device) {
  switch (p.cache_dtype) {
    case DType::kFloat32: return dispatch_width<T, B, float>(p, s, m, stream, device);
    case DType::kFloat16: return dispatch_width<T, B, __half>(p, s, m, stream, device);
    case DType::kBFloat16: return dispatch_width<T, B, __nv_bfloat16>(p, s, m, stream, device);
    case DType::kFloat64: return dispatch_width<T, B, double>(p, s, m, stream, device);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

template <typename T>
int dispatch_buffer(const RotaryParams& p, const KvStoreParams& s, const MropeParams* m, cudaStream_t stream,
                    int device) {
  switch (s.buffer_dtype) {
    case BufferDType::kFloat32: return dispatch_cache<T, float>(p, s, m, stream, device);
    case BufferDType::kFloat16: return dispatch_cache<T, __half>(p, s, m, stream, device);
    case BufferDType::kBFloat16: return dispatch_cache<T, __nv_bfloat16>(p, s, m, stream, device);
    case BufferDType::kFloat64: return dispatch_cache<T, double>(p, s, m, stream, device);
    case BufferDType::kFloat8E4M3: return dispatch_cache<T, E4M3>(p, s, m, stream, device);
    case BufferDType::kFloat8E5M2: return dispatch_cache<T, E5M2>(p, s, m, stream, device);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int dispatch_set_kv(const RotaryParams& p, const KvStoreParams& s, const MropeParams* m, void* stream, int device) {
  if (p.num_tokens == 0 || p.key == nullptr) return 0;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kFloat32: return dispatch_buffer<float>(p, s, m, st, device);
    case DType::kFloat16: return dispatch_buffer<__half>(p, s, m, st, device);
    case DType::kBFloat16: return dispatch_buffer<__nv_bfloat16>(p, s, m, st, device);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace

int launch_rotary_set_kv(const RotaryParams& p, const KvStoreParams& s, void* stream, int device) {
  return dispatch_set_kv(p, s, nullptr, stream, device);
}

int launch_mrope_set_kv(const RotaryParams& p, const KvStoreParams& s, const MropeParams& m, void* stream,
                        int device) {
  return dispatch_set_kv(p, s, &m, stream, device);
}

}  // namespace rope_compat
