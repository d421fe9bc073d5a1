// What the three CUDA translation units share (rotary_embedding_kernel.cu, mrope_kernel.cu and
// fused_kv_store_kernel.cu): vector types and accesses, conversions, the PDL prologue, and the
// host-side launch helpers. Everything here is inline or a template, so every .cu file may
// include it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "rotary_embedding.h"

namespace rope_compat {
namespace detail {

// Blocks of 256 threads (see launch_pdl for small calls): smaller blocks measured slower for
// large calls, although a plain pass over the same bytes prefers 128
// (benchmarks/studies/results/h200_partial_floor.txt).
inline constexpr int kBlock = 256;
inline constexpr int kMinBlock = 64;

// Division by a launch-time constant with a multiply and a shift (valid for n < 2^31):
// a plain integer division costs tens of instructions on the decode critical path.
struct FastDiv {
  uint32_t d, mul, shift;
  explicit FastDiv(uint32_t divisor = 1) : d(divisor), shift(0) {
    while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (__umulhi(n, mul) + n) >> shift; }
};

template <typename T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Vec {
  T v[N];
};

// q heads, then k heads when there is a key: the heads a token's threads walk through.
__host__ __device__ __forceinline__ int32_t total_heads(const RotaryParams& p) {
  return p.num_heads + (p.key == nullptr ? 0 : p.num_kv_heads);
}

// q/k/v accesses with the streaming (evict-first) cache hint: every q/k/v byte is touched
// exactly once, so caching it only displaces the cos/sin rows, which are reused.
template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_stream(const T* ptr) {
  if constexpr (sizeof(Vec<T, V>) == 16) {
    const int4 raw = __ldcs(reinterpret_cast<const int4*>(ptr));
    return *reinterpret_cast<const Vec<T, V>*>(&raw);
  } else {
    return *reinterpret_cast<const Vec<T, V>*>(ptr);
  }
}

// A store with the evict-first hint at every width __stcs takes (16, 8 or 4 bytes); other
// widths are plain stores.
template <typename U, int N>
__device__ __forceinline__ void store_evict_first(void* ptr, const Vec<U, N>& v) {
  constexpr int kBytes = sizeof(Vec<U, N>);
  if constexpr (kBytes == 16) {
    __stcs(reinterpret_cast<int4*>(ptr), *reinterpret_cast<const int4*>(&v));
  } else if constexpr (kBytes == 8) {
    __stcs(reinterpret_cast<int2*>(ptr), *reinterpret_cast<const int2*>(&v));
  } else if constexpr (kBytes == 4) {
    __stcs(reinterpret_cast<int*>(ptr), *reinterpret_cast<const int*>(&v));
  } else {
    *reinterpret_cast<Vec<U, N>*>(ptr) = v;
  }
}

// q/k vectors take the hint at 16 bytes only; narrower ones are stored plainly (as the plain
// and MRoPE kernels were timed).
template <typename T, int V>
__device__ __forceinline__ void store_stream(T* ptr, const Vec<T, V>& v) {
  if constexpr (sizeof(Vec<T, V>) == 16) {
    store_evict_first(ptr, v);
  } else {
    *reinterpret_cast<Vec<T, V>*>(ptr) = v;
  }
}

// Heads h0, h0 + stride, ... (kBatch of them) of one token, q heads then k heads below
// heads_total: their pointers (nullptr past the last) and both vectors of each, every load issued
// before any is used, so that a thread has kBatch heads' loads in flight at once.
template <typename T, int V, int kBatch>
__device__ __forceinline__ void load_heads(const RotaryParams& p, T* q_tok, T* k_tok, int32_t heads_total, int32_t h0,
                                           int32_t stride, int32_t e1, int32_t e2, T* (&head)[kBatch],
                                           Vec<T, V> (&x)[kBatch], Vec<T, V> (&y)[kBatch]) {
#pragma unroll
  for (int m = 0; m < kBatch; ++m) {
    const int32_t h = h0 + m * stride;
    head[m] = h < p.num_heads     ? q_tok + h * p.q_head_stride
              : h < heads_total ? k_tok + (h - p.num_heads) * p.k_head_stride
                                : nullptr;
    if (head[m] != nullptr) {
      x[m] = load_stream<T, V>(head[m] + e1);
      y[m] = load_stream<T, V>(head[m] + e2);
    }
  }
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(double x) { return static_cast<float>(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ int64_t load_index(const void* p, bool is_int64, int64_t i) {
  return is_int64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

// N cos and N sin values as floats: cache_row[0, N) and cache_row[half, half + N).
template <typename CT, int N>
__device__ __forceinline__ void load_cos_sin(const CT* cache_row, int32_t half, float (&c)[N], float (&sn)[N]) {
  const Vec<CT, N> cv = *reinterpret_cast<const Vec<CT, N>*>(cache_row);
  const Vec<CT, N> sv = *reinterpret_cast<const Vec<CT, N>*>(cache_row + half);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    c[i] = to_float(cv.v[i]);
    sn[i] = to_float(sv.v[i]);
  }
}

// What a kernel launched by launch_pdl does first (see use_pdl): let the next kernel launch
// now, and wait for the previous one's writes.
__device__ __forceinline__ void pdl_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// N cache values as loaded, converted one by one where they are used. Two-byte types are kept
// as 32-bit words: a vector of 16-bit values is unpacked right at the load, and unpacking waits
// for the load to return.
template <typename CT, int N, bool kWords = (sizeof(CT) == 2 && N % 2 == 0)>
struct Stored {
  Vec<CT, N> v;
  __device__ __forceinline__ float get(int i) const { return to_float(v.v[i]); }
};
template <typename CT, int N>
struct alignas(2 * N < 16 ? 2 * N : 16) Stored<CT, N, true> {
  uint32_t w[N / 2];
  __device__ __forceinline__ float get(int i) const {
    const uint32_t bits = i % 2 == 0 ? w[i / 2] & 0xffffu : w[i / 2] >> 16;
    if constexpr (std::is_same_v<CT, __nv_bfloat16>) {
      return __uint_as_float(bits << 16);
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    }
  }
};

// The cos/sin of N consecutive pairs from one cache row (`[cos | sin]`, `half` apart), kept as
// stored: a thread issues these loads before it waits on anything and converts them only where
// the arithmetic uses them, so that no load waits for another (rotary_embedding_kernel.cu).
template <typename CT, int N>
struct CosSinRow {
  Stored<CT, N> c, s;
  __device__ __forceinline__ void load(const CT* at, int32_t half) {
    c = *reinterpret_cast<const Stored<CT, N>*>(at);
    s = *reinterpret_cast<const Stored<CT, N>*>(at + half);
  }
  __device__ __forceinline__ float cos(int k) const { return c.get(k); }
  __device__ __forceinline__ float sin(int k) const { return s.get(k); }
};

// The V cos and sin that rotate a thread's pairs, as floats, from cache values kept as stored
// (CosSinRow, MropeCosSin): the inverse rotation negates the sin, which is exact. Where `use`
// is false (a token outside the cache that is stored back as loaded) the angle is 0.
template <int V, typename CosSin>
__device__ __forceinline__ void rotation_floats(const CosSin& cs, bool inverse, float (&c)[V], float (&sn)[V],
                                                bool use = true) {
  const float sign = inverse ? -1.f : 1.f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    c[i] = use ? cs.cos(i) : 1.f;
    sn[i] = use ? sign * cs.sin(i) : 0.f;
  }
}

template <bool kNeox, typename T, int V>
__device__ __forceinline__ void rotate_run(T (&run)[2 * V], const float (&c)[V], const float (&sn)[V]) {
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int ia = kNeox ? i : 2 * i;
    const int ib = kNeox ? V + i : 2 * i + 1;
    const float fa = to_float(run[ia]), fb = to_float(run[ib]);
    run[ia] = from_float<T>(fa * c[i] - fb * sn[i]);
    run[ib] = from_float<T>(fb * c[i] + fa * sn[i]);
  }
}

// Rotates the two vectors x and y of one head in registers.
template <typename T, int V>
__device__ __forceinline__ void rotate(Vec<T, V>& x, Vec<T, V>& y, const float (&c)[V], const float (&sn)[V],
                                       bool neox) {
  // The 2V elements [x | y]: NeoX pairs (i, V + i), GPT-J pairs (2i, 2i + 1).
  T run[2 * V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    run[i] = x.v[i];
    run[V + i] = y.v[i];
  }
  // Two unrolled copies so that every index is a compile-time constant (registers only).
  if (neox) {
    rotate_run<true, T, V>(run, c, sn);
  } else {
    rotate_run<false, T, V>(run, c, sn);
  }
#pragma unroll
  for (int i = 0; i < V; ++i) {
    x.v[i] = run[i];
    y.v[i] = run[V + i];
  }
}

// Rotates the two vectors x (at head + e1) and y (at head + e2) of one head and stores them.
template <typename T, int V>
__device__ __forceinline__ void rotate_store(T* head, int32_t e1, int32_t e2, Vec<T, V>& x, Vec<T, V>& y,
                                             const float (&c)[V], const float (&sn)[V], bool neox) {
  rotate<T, V>(x, y, c, sn, neox);
  store_stream<T, V>(head + e1, x);
  store_stream<T, V>(head + e2, y);
}

// Host side.

// Per-device facts, cached: querying them on every call would cost host time.
inline constexpr int kMaxDevices = 64;

inline int num_sms(int dev) {
  static int cached[kMaxDevices] = {0};
  if (dev < 0 || dev >= kMaxDevices) dev = 0;
  if (cached[dev] == 0) {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    cached[dev] = n > 0 ? n : 132;
  }
  return cached[dev];
}

// Threads the GPU holds at once (2048 per multiprocessor on sm_80 and newer): a call of at most
// this many runs in one wave, where latency rather than bandwidth sets its time.
inline int64_t resident_threads(int dev) { return static_cast<int64_t>(num_sms(dev)) * 2048; }

// Programmatic dependent launch (Hopper and newer): the kernel may be scheduled while the
// previous kernel in the stream is still running, which hides the launch latency of
// decode-sized calls. The kernel waits (griddepcontrol.wait) for the previous grid to finish
// and flush before it reads anything, so results are the same as with a plain launch.
// ROPE_COMPAT_PDL=0 turns it off.
inline bool use_pdl(int dev) {
  static const bool enabled = [] {
    const char* env = std::getenv("ROPE_COMPAT_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  if (!enabled) return false;
  static int cached[kMaxDevices] = {0};  // 0 unknown, 1 yes, 2 no
  if (dev < 0 || dev >= kMaxDevices) return false;
  if (cached[dev] == 0) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cached[dev] = major >= 9 ? 1 : 2;
  }
  return cached[dev] == 1;
}

// Where a launch goes: the stream, and the device it belongs to (the current one).
struct Target {
  cudaStream_t stream;
  int device;
};

// Launches `kernel` (which starts with pdl_prologue) over `threads` threads.
// benchmarks/studies/floors.cuh copies this launch, so that its floors are launched as the
// kernel is: keep the two alike.
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), int64_t threads, const Target& t, const Args&... args) {
  // Blocks of 256 threads, smaller (down to kMinBlock) while that leaves multiprocessors idle:
  // a decode-sized call then spreads its loads over more SMs.
  int block = kBlock;
  while (block > kMinBlock && (threads + block - 1) / block < num_sms(t.device)) block /= 2;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>((threads + block - 1) / block));
  config.blockDim = dim3(block);
  config.stream = t.stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = use_pdl(t.device) ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// Tokens per launch for `units_per_token` threads a token: huge calls are split so that every
// thread index fits in 31 bits.
inline int64_t tokens_per_launch(int64_t units_per_token) {
  return std::max<int64_t>(((int64_t{1} << 31) - kBlock) / units_per_token, 1);
}

// Heads per thread for the rotation kernels (rotary_kernel, mrope_kernel), 1 or 4.
// Small calls: one head per thread, for the most parallelism and the shortest chain (several
// heads per thread lengthen each thread's chain more than they save).
// Large calls: 4 heads per thread, so the cos/sin row is reused (how many of them have loads
// in flight at once: see rotary_embedding_kernel.cu's launch()).
// Where one changes to the other: one head per thread while the call has fewer than 8 units
// (threads at one head each) for each thread the GPU holds at once, so that a call fills the
// GPU before it trades parallelism for reuse; a higher limit gained nothing in an engine-like
// sequence (benchmarks/studies/results/h200_launch_limits.txt).
inline int64_t heads_per_thread(const RotaryParams& p, int32_t units_per_head, int device) {
  const int64_t work = static_cast<int64_t>(p.num_tokens) * total_heads(p) * units_per_head;
  return work < 8 * resident_threads(device) ? 1 : 4;
}

// Vector width for a rotation call: the widest the pointers and strides allow, except that a
// call of 2048 to 6144 threads at 16-byte vectors runs with 8-byte vectors (twice the threads):
// twice the threads put more loads in flight at once. That is the range where it measured
// faster; outside it the narrower accesses measured slower
// (benchmarks/studies/results/h200_launch_limits.txt).
template <typename T>
int call_width(const RotaryParams& p) {
  const int v = vector_width(p);
  if (v * static_cast<int>(sizeof(T)) != 16) return v;
  const int64_t heads_total = total_heads(p);
  const int64_t threads = static_cast<int64_t>(p.num_tokens) * heads_total * (p.rot_dim / 2 / v);
  return threads >= 2048 && threads <= 6144 ? v / 2 : v;
}

inline int element_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    default: return 2;
  }
}

inline bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
}

}  // namespace detail
}  // namespace rope_compat
