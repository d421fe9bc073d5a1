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
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "rotary_embedding.h"

namespace rope_compat {
namespace {

// Blocks of 256 threads (see launch_pdl for small calls): smaller blocks measured slower for
// large calls, although a plain pass over the same bytes prefers 128
// (benchmarks/studies/results/h200_partial_floor.txt).
constexpr int kBlock = 256;
constexpr int kMinBlock = 64;

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

struct Launch {
  FastDiv units_per_token, units_per_head, seq_len;
  int32_t groups, token_begin, token_end;
};

template <typename T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Vec {
  T v[N];
};

// q heads, then k heads when there is a key: the heads a token's threads walk through.
__host__ __device__ __forceinline__ int32_t total_heads(const RotaryParams& p) {
  return p.num_heads + (p.key == nullptr ? 0 : p.num_kv_heads);
}

// q/k accesses with the streaming (evict-first) cache hint: every q/k byte is touched exactly
// once, so caching it only displaces the cos/sin rows, which are reused.
template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_qk(const T* ptr) {
  if constexpr (sizeof(Vec<T, V>) == 16) {
    const int4 raw = __ldcs(reinterpret_cast<const int4*>(ptr));
    return *reinterpret_cast<const Vec<T, V>*>(&raw);
  } else {
    return *reinterpret_cast<const Vec<T, V>*>(ptr);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_qk(T* ptr, const Vec<T, V>& v) {
  if constexpr (sizeof(Vec<T, V>) == 16) {
    __stcs(reinterpret_cast<int4*>(ptr), *reinterpret_cast<const int4*>(&v));
  } else {
    *reinterpret_cast<Vec<T, V>*>(ptr) = v;
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

// Rotates the two vectors x (at head + e1) and y (at head + e2) of one head and stores them.
template <typename T, int V>
__device__ __forceinline__ void rotate_store(T* head, int32_t e1, int32_t e2, Vec<T, V>& x, Vec<T, V>& y,
                                             const float (&c)[V], const float (&sn)[V], bool neox) {
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
  store_qk<T, V>(head + e1, x);
  store_qk<T, V>(head + e2, y);
}

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
    const CT* cache_row = static_cast<const CT*>(p.cache) + row * p.cache_row_stride + j * V;
    const Stored<CT, V> cv = *reinterpret_cast<const Stored<CT, V>*>(cache_row);
    const Stored<CT, V> sv = *reinterpret_cast<const Stored<CT, V>*>(cache_row + half);
    T* const head = group < p.num_heads ? q_tok + group * p.q_head_stride
                                        : k_tok + (group - p.num_heads) * p.k_head_stride;
    Vec<T, V> x = load_qk<T, V>(head + e1), y = load_qk<T, V>(head + e2);
    const float sign = p.inverse ? -1.f : 1.f;
    float c[V], sn[V];
#pragma unroll
    for (int i = 0; i < V; ++i) {
      c[i] = cv.get(i);
      sn[i] = sign * sv.get(i);  // exact: sign is +1 or -1
    }
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
#pragma unroll
    for (int m = 0; m < kHeadsPerBatch; ++m) {
      const int32_t h = h0 + m * groups;
      head[m] = h < p.num_heads     ? q_tok + h * p.q_head_stride
                : h < heads_total ? k_tok + (h - p.num_heads) * p.k_head_stride
                                  : nullptr;
      if (head[m] != nullptr) {
        x[m] = load_qk<T, V>(head[m] + e1);
        y[m] = load_qk<T, V>(head[m] + e2);
      }
    }
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

// Per-device facts, cached: querying them on every call would cost host time.
constexpr int kMaxDevices = 64;

int num_sms(int dev) {
  static int cached[kMaxDevices] = {0};
  if (dev < 0 || dev >= kMaxDevices) dev = 0;
  if (cached[dev] == 0) {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    cached[dev] = n > 0 ? n : 132;
  }
  return cached[dev];
}

// Programmatic dependent launch (Hopper and newer): the kernel may be scheduled while the
// previous kernel in the stream is still running, which hides the launch latency of
// decode-sized calls. The kernel waits (griddepcontrol.wait) for the previous grid to finish
// and flush before it reads anything, so results are the same as with a plain launch.
// ROPE_COMPAT_PDL=0 turns it off.
bool use_pdl(int dev) {
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

template <typename T, typename CT, int V>
int launch(const RotaryParams& p, const Target& t) {
  const int32_t units_per_head = p.rot_dim / 2 / V;
  const int32_t heads_total = total_heads(p);
  // Small calls: one head per thread, for the most parallelism and the shortest chain (several
  // heads per thread lengthen each thread's chain more than they save).
  // Large calls: 4 heads per thread, so the cos/sin row is reused. How many of them have loads
  // in flight at once: 2 for whole 128-dim heads (8+ units a head), whose loads are already
  // wide, and 4 for 64 rotated dims (4 units a head); more measured slower in both cases.
  // Where one changes to the other: one head per thread while the call has fewer than 8 units
  // (threads at one head each) for each thread the GPU holds at once, so that a call fills the
  // GPU before it trades parallelism for reuse; a higher limit gained nothing in an engine-like
  // sequence (benchmarks/studies/results/h200_launch_limits.txt).
  const int64_t work = static_cast<int64_t>(p.num_tokens) * heads_total * units_per_head;
  const int64_t resident = static_cast<int64_t>(num_sms(t.device)) * 2048;
  const int64_t per_thread = work < 8 * resident ? 1 : 4;
  Launch l;
  l.groups = static_cast<int32_t>((heads_total + per_thread - 1) / per_thread);
  l.units_per_token = FastDiv(static_cast<uint32_t>(l.groups * units_per_head));
  l.units_per_head = FastDiv(static_cast<uint32_t>(units_per_head));
  l.seq_len = FastDiv(static_cast<uint32_t>(p.seq_len));
  // Split huge calls so that every thread index fits in 31 bits.
  const int64_t tokens_per_launch = std::max<int64_t>(((int64_t{1} << 31) - kBlock) / l.units_per_token.d, 1);
  for (int64_t begin = 0; begin < p.num_tokens; begin += tokens_per_launch) {
    l.token_begin = static_cast<int32_t>(begin);
    l.token_end = static_cast<int32_t>(std::min<int64_t>(p.num_tokens, begin + tokens_per_launch));
    const int64_t threads = static_cast<int64_t>(l.token_end - l.token_begin) * l.units_per_token.d;
    const cudaError_t err = per_thread == 1      ? launch_pdl(rotary_kernel<T, CT, V, 1>, threads, t, p, l)
                            : units_per_head >= 8 ? launch_pdl(rotary_kernel<T, CT, V, 2>, threads, t, p, l)
                                                  : launch_pdl(rotary_kernel<T, CT, V, 4>, threads, t, p, l);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  return 0;
}

// Vector width for this call: the widest the pointers and strides allow, except that a call
// of 2048 to 6144 threads at 16-byte vectors runs with 8-byte vectors (twice the threads):
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

int element_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    default: return 2;
  }
}

bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
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
