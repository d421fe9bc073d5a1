// The MRoPE kernel against the plain kernel on the same q/k, without torch: what an MRoPE call
// costs over a plain rope call of the same shape and tokens (the target is at most 1.1x).
//
// For each shape (bf16 q/k sliced from a fused qkv tensor, NeoX, float32 cache of 262144 rows
// of real angles, random int64 positions [3, T] with three different rows, CUDA-graph replays
// over input sets that together exceed 2.5x the L2) it prints the MRoPE kernel's time, the
// plain kernel's on the temporal row, and their ratio; also the MRoPE kernel with the three
// rows equal (a text token, where the three rows are one). Before timing, the MRoPE kernel is
// checked against a float64 reference on the host at 1000 tokens (one head per thread) and
// 12000 tokens (several heads per thread).
//
// Two floors, trivial kernels with the two ops' access patterns and no arithmetic to speak of
// (one thread per token, head and vector of V pairs, launched as the kernels launch; V halved
// where the kernels halve it): "floor1" loads the token's position and its V cos and V sin
// from that row, and loads and stores the head's two q/k vectors, as the plain op moves its
// bytes; "floor3" loads the three positions and takes its cos/sin from the row of its pairs'
// section, contiguous sections as given (for the interleaved shape that is a lower bound: its
// pairs take the same three rows, more scattered). floor3 / floor1 is what reading three random
// rows per token instead of one costs by itself.
//
// Build and run from the repository root on a CUDA machine (no torch needed); both kernels are
// linked from their own source files, as the extension links them:
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc -o /tmp/mrope_vs_plain benchmarks/studies/mrope_vs_plain.cu \
//       csrc/mrope_kernel.cu csrc/rotary_embedding_kernel.cu
//   /tmp/mrope_vs_plain [tokens,...]          (CACHE=bf16 in the environment: both kernels read a bf16 cache)
// To time another version of the MRoPE kernel, link its .cu file instead of csrc/mrope_kernel.cu.
#include "mrope.h"
#include "rotary_embedding.h"
#include "floors.cuh"
#include "qkv_params.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using namespace rope_compat;

namespace {

struct Shape {
  const char* name;
  int hq, hk, d;
  int section[3];
  bool interleaved;
};

constexpr int64_t kCacheRows = 262144;

int section_of(const Shape& s, int i) {
  if (!s.interleaved) return (i >= s.section[0]) + (i >= s.section[0] + s.section[1]);
  return (i % 3 == 1 && i < 3 * s.section[1]) ? 1 : (i % 3 == 2 && i < 3 * s.section[2]) ? 2 : 0;
}

struct Set {
  __nv_bfloat16* qkv;
  int64_t* pos;  // [3, T]
};

// With CACHE=bf16 in the environment both kernels read a bf16 copy of the cache (after the
// check, which is against the float32 one); the floors keep the float32 cache.
const __nv_bfloat16* g_cache_bf16 = nullptr;

RotaryParams params(const Shape& s, const Set& set, const float* cache, int tokens) {
  RotaryParams p = fused_qkv_params(set.qkv, set.pos, cache, kCacheRows, tokens, s.hq, s.hk, s.d, s.d, true);
  if (g_cache_bf16 != nullptr) p.cache = g_cache_bf16, p.cache_dtype = DType::kBFloat16;
  return p;
}

MropeParams mrope_params(const Shape& s, int tokens) {
  MropeParams m{};
  m.positions_row_stride = tokens;
  for (int i = 0; i < 3; ++i) m.section[i] = s.section[i];
  m.interleaved = s.interleaved;
  return m;
}

float bf(__nv_bfloat16 x) { return __bfloat162float(x); }

// Largest error of the MRoPE kernel against a float64 reference, in units of bf16 rounding of
// the result (|err| / max(|ref|, 1) / 2^-8); pass-through or out-of-rotation changes count as huge.
double check(const Shape& s, const std::vector<float>& cache, const float* d_cache, int tokens) {
  const int row = (s.hq + 2 * s.hk) * s.d, half = s.d / 2;
  std::mt19937_64 rng(7);
  std::vector<__nv_bfloat16> qkv(static_cast<size_t>(tokens) * row);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (auto& x : qkv) x = __float2bfloat16(u(rng));
  std::vector<int64_t> pos(3 * tokens);
  for (auto& x : pos) x = static_cast<int64_t>(rng() % kCacheRows);
  Set set;
  CK(cudaMalloc(&set.qkv, qkv.size() * 2));
  CK(cudaMalloc(&set.pos, pos.size() * 8));
  CK(cudaMemcpy(set.qkv, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(set.pos, pos.data(), pos.size() * 8, cudaMemcpyHostToDevice));
  const int err = launch_mrope_rotary_embedding(params(s, set, d_cache, tokens), mrope_params(s, tokens), nullptr, 0);
  if (err != 0) {
    printf("launch failed: %s\n", cudaGetErrorString(static_cast<cudaError_t>(err)));
    exit(1);
  }
  std::vector<__nv_bfloat16> out(qkv.size());
  CK(cudaMemcpy(out.data(), set.qkv, out.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaFree(set.qkv));
  CK(cudaFree(set.pos));
  double worst = 0;
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < s.hq + 2 * s.hk; ++h) {
      const int64_t base = static_cast<int64_t>(t) * row + static_cast<int64_t>(h) * s.d;
      for (int i = 0; i < half; ++i) {
        double x = bf(qkv[base + i]), y = bf(qkv[base + i + half]), rx = x, ry = y;
        if (h < s.hq + s.hk) {
          const float* r = cache.data() + pos[section_of(s, i) * tokens + t] * s.d;
          const double c = r[i], sn = r[half + i];
          rx = x * c - y * sn;
          ry = y * c + x * sn;
        }
        const double ex = std::fabs(bf(out[base + i]) - rx) / std::max(std::fabs(rx), 1.0) / (1.0 / 256);
        const double ey = std::fabs(bf(out[base + i + half]) - ry) / std::max(std::fabs(ry), 1.0) / (1.0 / 256);
        worst = std::max(worst, std::max(ex, ey));
      }
    }
  }
  return worst;
}

// The floors (see the header). V bf16 q/k elements and V float cos/sin values per vector.
template <int V, int kRows>
__global__ void pattern_floor(__nv_bfloat16* qkv, const int64_t* pos, const float* cache, int tokens, int heads,
                              int64_t row, int d, int64_t pos_row_stride, int t_end, int h_end) {
  pdl_prologue();
  using QK = typename std::conditional<V == 8, uint4, uint2>::type;  // V bf16
  const int units = d / 2 / V;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(tokens) * heads * units) return;
  const int t = static_cast<int>(i / (heads * units));
  const int rem = static_cast<int>(i - static_cast<int64_t>(t) * heads * units);
  const int h = rem / units, j = rem - h * units;
  int64_t r = pos[t];
  if (kRows == 3) {
    const int64_t r1 = pos[pos_row_stride + t], r2 = pos[2 * pos_row_stride + t];
    const int first = j * V;
    r = first < t_end ? r : first < h_end ? r1 : r2;
  }
  const float4* c = reinterpret_cast<const float4*>(cache + r * d + j * V);
  const float4* sn = reinterpret_cast<const float4*>(cache + r * d + d / 2 + j * V);
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < V / 4; ++k) acc += c[k].x + sn[k].y;
  QK* x = reinterpret_cast<QK*>(qkv + t * row + static_cast<int64_t>(h) * d + j * V);
  QK* y = reinterpret_cast<QK*>(qkv + t * row + static_cast<int64_t>(h) * d + d / 2 + j * V);
  QK a = *x, b = *y;
  a.x ^= __float_as_uint(acc) & 1u;  // uses every load; flips at most one bit
  b.x ^= __float_as_uint(acc) & 2u;
  *x = a;
  *y = b;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int> token_list = token_counts(argc, argv, {1, 16, 128, 1024, 8192, 32768});
  const Shape shapes[] = {
      {"qwen2.5-vl-7b", 28, 4, 128, {16, 24, 24}, false},
      {"qwen3-vl-8b", 32, 8, 128, {24, 20, 20}, true},
  };
  int l2 = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, L2 %d MiB\n", prop.name, l2 >> 20);

  const int d = 128, half = d / 2;
  std::vector<float> cache(kCacheRows * d);
  for (int64_t r = 0; r < kCacheRows; ++r) {
    for (int i = 0; i < half; ++i) {
      const double ang = r * std::pow(1e6, -2.0 * i / d);
      cache[r * d + i] = static_cast<float>(std::cos(ang));
      cache[r * d + half + i] = static_cast<float>(std::sin(ang));
    }
  }
  float* d_cache;
  CK(cudaMalloc(&d_cache, cache.size() * 4));
  CK(cudaMemcpy(d_cache, cache.data(), cache.size() * 4, cudaMemcpyHostToDevice));

  for (const Shape& s : shapes) {
    for (int tokens : {1000, 12000}) {
      printf("%s, %d tokens: worst error %.3f bf16 ulps of the result\n", s.name, tokens,
             check(s, cache, d_cache, tokens));
    }
  }

  const char* cache_env = std::getenv("CACHE");
  if (cache_env != nullptr && std::string(cache_env) == "bf16") {
    std::vector<__nv_bfloat16> c16(cache.size());
    for (size_t i = 0; i < cache.size(); ++i) c16[i] = __float2bfloat16(cache[i]);
    __nv_bfloat16* d16;
    CK(cudaMalloc(&d16, c16.size() * 2));
    CK(cudaMemcpy(d16, c16.data(), c16.size() * 2, cudaMemcpyHostToDevice));
    g_cache_bf16 = d16;
    printf("both kernels read a bf16 cache (floors: float32)\n");
  }
  printf("%-14s %7s %10s %10s %10s %11s %12s %9s %9s %13s\n", "shape", "tokens", "mrope us", "plain us", "mrope/plain",
         "same-rows us", "same/plain", "floor1", "floor3", "floor3/floor1");
  for (const Shape& s : shapes) {
    const int64_t row = static_cast<int64_t>(s.hq + 2 * s.hk) * s.d;
    for (int tokens : token_list) {
      const int64_t set_bytes = tokens * row * 2 + 3 * tokens * 8;
      const int n_sets = static_cast<int>(std::max<int64_t>(1, 5 * static_cast<int64_t>(l2) / 2 / set_bytes + 1));
      // One allocation each for all sets' qkv and positions, filled on the device.
      __nv_bfloat16* qkv_all;
      int64_t *pos_all, *same_all;
      const int64_t qkv_n = n_sets * tokens * row, pos_n = n_sets * 3 * static_cast<int64_t>(tokens);
      CK(cudaMalloc(&qkv_all, qkv_n * 2));
      CK(cudaMalloc(&pos_all, pos_n * 8));
      CK(cudaMalloc(&same_all, pos_n * 8));
      fill_bf16<<<1024, 256>>>(qkv_all, qkv_n, tokens);
      fill_pos<<<1024, 256>>>(pos_all, pos_n, kCacheRows, tokens + 1);
      CK(cudaGetLastError());
      std::vector<Set> sets(n_sets), same(n_sets);
      for (int k = 0; k < n_sets; ++k) {
        sets[k] = {qkv_all + k * tokens * row, pos_all + k * 3 * static_cast<int64_t>(tokens)};
        same[k] = {sets[k].qkv, same_all + k * 3 * static_cast<int64_t>(tokens)};
        for (int r = 0; r < 3; ++r) {
          CK(cudaMemcpyAsync(same[k].pos + r * tokens, sets[k].pos, tokens * 8, cudaMemcpyDeviceToDevice));
        }
      }
      CK(cudaDeviceSynchronize());
      const MropeParams m = mrope_params(s, tokens);
      auto mrope = [&](std::vector<Set>& v) {
        return time_graph(n_sets, [&](int i, cudaStream_t st) {
          CK(static_cast<cudaError_t>(launch_mrope_rotary_embedding(params(s, v[i], d_cache, tokens), m, st, 0)));
        });
      };
      const float t_mrope = mrope(sets);
      const float t_plain = time_graph(n_sets, [&](int i, cudaStream_t st) {
        CK(static_cast<cudaError_t>(launch_rotary_embedding(params(s, sets[i], d_cache, tokens), st, 0)));
      });
      const float t_same = mrope(same);
      // The kernels' vector width for this call (kernel_common.cuh's call_width: 16-byte vectors
      // halved for 2048-6144 threads).
      const int64_t wide_threads = static_cast<int64_t>(tokens) * (s.hq + s.hk) * (s.d / 2 / 8);
      const bool narrow = wide_threads >= 2048 && wide_threads <= 6144;
      auto floor_of = [&](int rows) {
        return time_graph(n_sets, [&](int i, cudaStream_t st) {
          const int v = narrow ? 4 : 8;
          const int64_t threads = static_cast<int64_t>(tokens) * (s.hq + s.hk) * (s.d / 2 / v);
          const int t_end = s.section[0], h_end = s.section[0] + s.section[1];
          auto* k = narrow ? (rows == 3 ? pattern_floor<4, 3> : pattern_floor<4, 1>)
                           : (rows == 3 ? pattern_floor<8, 3> : pattern_floor<8, 1>);
          CK(launch_dependent(k, threads, st, sets[i].qkv, sets[i].pos, static_cast<const float*>(d_cache), tokens,
                              s.hq + s.hk, row, s.d, static_cast<int64_t>(tokens), t_end, h_end));
        });
      };
      const float t_floor1 = floor_of(1), t_floor3 = floor_of(3);
      printf("%-14s %7d %10.2f %10.2f %10.2f %11.2f %12.2f %9.2f %9.2f %13.2f\n", s.name, tokens, t_mrope, t_plain,
             t_mrope / t_plain, t_same, t_same / t_plain, t_floor1, t_floor3, t_floor3 / t_floor1);
      fflush(stdout);
      CK(cudaFree(qkv_all));
      CK(cudaFree(pos_all));
      CK(cudaFree(same_all));
    }
  }
  return 0;
}
