// The kernel against two floors, without torch: how close is it to a simple pass over its bytes?
//
// For each shape and token count (bf16 q/k sliced from a fused qkv tensor, float32 cache of
// 131072 rows, random int64 positions, CUDA-graph replays of 20 calls over input sets that
// together exceed twice the L2, at most 200), it prints the kernel's time and:
//   pattern: a trivial in-place kernel (one thread per 16-byte chunk, load, store back) over
//            exactly the rotated bytes of the same q/k views: what that access pattern allows
//            a plain streaming kernel, before reading positions or cache rows (a kernel that
//            keeps more loads in flight can beat it a little);
//   contig:  the same kernel over a contiguous buffer of as many bytes;
//   bulk:    (mode 2) the same rotated bytes moved by the bulk tensor copy engine instead of
//            threads: boxes of (rotated dims, q+k heads, 2 or 4 tokens) into shared memory and
//            back, six stages deep, 2 or 4 blocks per SM; the best of those four is printed.
//            It shows whether the pattern floor is a limit of the threads or of the memory.
// At 1024 and 8192 tokens it also checks the kernel against a CPU float reference (and that
// nothing outside the rotated dims changed).
//
// Decode floors (floors mode, up to 128 tokens): kernels launched the way the kernel is, with
// programmatic dependent launch where it uses it and blocks shrunk to as few as 64 threads
// to fill the SMs, that each do one part of its work: empty (the launch and the kernel
// boundary alone), chain (read the token's position, then its cos and sin vectors: the
// dependent loads, without q/k) and pattern (the pattern pass over the rotated q/k bytes,
// without positions or cache). The kernel does all three, so with this launch it cannot take
// less than the slowest of them; how far above that it lies is what overlap leaves on the table.
//
// Input sets -1 (engine sequence, kernel only): before every call of the kernel, a read of twice
// the L2 with plain loads (as an engine's GEMMs stream their weights between two RoPE calls, so
// positions and cache rows are cold) and a kernel that rewrites the whole qkv tensor (as the qkv
// projection does just before RoPE, so q/k are in L2). The kernel's figure is its cost in that
// sequence: graph time with the kernel minus graph time without it (the mean of one run before
// and one after). The empty kernel, launched the same way, is timed in the same place: the part
// of a call's cost that is the kernel boundary alone. Back-to-back calls of the kernel alone
// overlap one call's memory latency with the next call's start; in this sequence the kernel
// follows a different kernel, as in a model.
//
// Build and run from the repository root on a CUDA machine (no torch needed). The kernel is
// linked from its own source file and called through csrc/rotary_embedding.h, as the extension
// calls it:
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc -o /tmp/kernel_floors benchmarks/studies/kernel_floors.cu \
//       csrc/rotary_embedding_kernel.cu
//   /tmp/kernel_floors [tokens,...] [shape substring|all] [1 = also time the floors, 2 = and bulk]
//                      [input sets: 0 = enough to spill L2 (default), 1 = every call on the same inputs,
//                       -1 = engine sequence]
// ROPE_COMPAT_PDL=0 in the environment times the kernel (and the floors) without programmatic
// dependent launch. To time a variant of the kernel, link its .cu file instead.
#include "rotary_embedding.h"
#include "floors.cuh"
#include "qkv_params.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

using namespace rope_compat;

struct Shape {
  const char* name;
  int hq, hk, d, rot;
  bool neox;
};

__global__ void touch_contig(int4* p, int64_t n16, int flip) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x * 4 + threadIdx.x;
  int4 v[4];
#pragma unroll
  for (int u = 0; u < 4; ++u)
    if (i + u * blockDim.x < n16) v[u] = __ldcs(p + i + u * blockDim.x);
#pragma unroll
  for (int u = 0; u < 4; ++u)
    if (i + u * blockDim.x < n16) {
      v[u].x ^= flip;
      __stcs(p + i + u * blockDim.x, v[u]);
    }
}

// One thread per 16-byte chunk of the rotated region of (token, head). kDependent: starts as the
// kernel does under programmatic dependent launch (the decode floors launch it that way).
template <bool kDependent = false>
__global__ void touch_pattern(char* base, int64_t tokens, int heads, int chunks, int64_t tok_stride,
                              int64_t head_stride, int flip) {
  if constexpr (kDependent) pdl_prologue();
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int64_t per_tok = (int64_t)heads * chunks;
  if (i >= tokens * per_tok) return;
  int64_t t = i / per_tok;
  int r = (int)(i - t * per_tok);
  int h = r / chunks, c = r - h * chunks;
  int4* q = reinterpret_cast<int4*>(base + t * tok_stride + h * head_stride) + c;
  int4 v = __ldcs(q);
  v.x ^= flip;
  __stcs(q, v);
}

__global__ void empty_dependent() { pdl_prologue(); }

// The dependent loads alone: position, then 16 bytes of cos and 16 of sin from its cache row.
__global__ void chain_dependent(const int64_t* pos, const float* cache, int64_t tokens, int per_tok, int rot,
                                float* sink) {
  pdl_prologue();
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= tokens * per_tok) return;
  const int64_t t = i / per_tok;
  const int c = (int)(i - t * per_tok) % (rot / 8);
  const float* row = cache + pos[t] * rot + c * 4;
  const float4 a = *reinterpret_cast<const float4*>(row), b = *reinterpret_cast<const float4*>(row + rot / 2);
  const float v = a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w;
  if (v == 12345.f) *sink = v;  // a use of the loads that never stores in practice
}

// Launched as the kernel launches itself (small blocks for small calls, programmatic dependent
// launch where the kernel uses it), on device 0.
template <typename... Params, typename... Args>
void launch_like_kernel(void (*kernel)(Params...), int64_t threads, cudaStream_t s, const Args&... args) {
  CK(launch_dependent(kernel, threads, s, args...));
}

// The bulk pass: one thread per block walks tiles of `tb` tokens, `stages` boxes in flight. A box
// is loaded into shared memory (completing on an mbarrier) and stored back from there; a stage
// is refilled once the store that used it has read shared memory.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__global__ void __launch_bounds__(32) bulk_touch(const __grid_constant__ CUtensorMap map, int tiles, int tb,
                                                 int stages, int box_bytes) {
  extern __shared__ __align__(1024) unsigned char boxes[];
  __shared__ __align__(8) uint64_t full[8];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < stages; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&full[s])));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const uint64_t m = reinterpret_cast<uint64_t>(&map);
  auto load = [&](int tile, int s) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&full[s])), "r"(box_bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(
            smem_u32(boxes + s * box_bytes)),
        "l"(m), "r"(0), "r"(0), "r"(tile * tb), "r"(smem_u32(&full[s]))
        : "memory");
  };
  for (int k = 0; k < stages; ++k)
    if (blockIdx.x + k * gridDim.x < tiles) load(blockIdx.x + k * gridDim.x, k);
  int it = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++it) {
    const int s = it % stages;
    uint32_t done = 0;
    while (!done)
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done)
                   : "r"(smem_u32(&full[s])), "r"((it / stages) & 1)
                   : "memory");
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(m), "r"(0),
                 "r"(0), "r"(tile * tb), "r"(smem_u32(boxes + s * box_bytes))
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    if (it >= 1) {
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      const int next = tile + (stages - 1) * gridDim.x;
      if (next < tiles) load(next, (it - 1) % stages);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Plain (L2-allocating) loads over a buffer, to push everything else out of L2.
__global__ void evict_read(const int4* p, int64_t n16, int* sink) {
  int acc = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16; i += (int64_t)gridDim.x * blockDim.x) {
    const int4 v = p[i];
    acc ^= v.x ^ v.w;
  }
  if (acc == 0x7fffffff) *sink = acc;  // a use of the loads that never stores in practice
}

int main(int argc, char** argv) {
  const std::vector<int> token_list = token_counts(argc, argv, {1, 16, 128, 1024, 8192, 32768, 131072});
  const char* only = argc > 2 && strcmp(argv[2], "all") ? argv[2] : nullptr;
  const int floors = argc > 3 ? atoi(argv[3]) : 0;
  const int sets_arg = argc > 4 ? atoi(argv[4]) : 0;
  std::vector<Shape> shapes = {{"32/8x128 neox", 32, 8, 128, 128, true},
                               {"64/8x128 neox", 64, 8, 128, 128, true},
                               {"32/32x128 r64 neox", 32, 32, 128, 64, true},
                               {"16/16x256 r64 gptj", 16, 16, 256, 64, false}};
  const int rows = 131072;
  const bool engine = sets_arg < 0;
  int4* evict = nullptr;
  int64_t evict16 = 0;
  if (engine) {
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    evict16 = 2LL * l2 / 16;
    CK(cudaMalloc(&evict, evict16 * 16));
    CK(cudaMemset(evict, 0, evict16 * 16));
  }
  float* sink;
  CK(cudaMalloc(&sink, 4));
  std::mt19937_64 rng(1);
  for (const Shape& sh : shapes) {
    if (only && !strstr(sh.name, only)) continue;
    // Cache [rows, rot] float32.
    float* cache;
    CK(cudaMalloc(&cache, (size_t)rows * sh.rot * 4));
    fill_f32<<<1024, 256>>>(cache, (int64_t)rows * sh.rot, 7);
    for (int T : token_list) {
      const int64_t row_elems = (int64_t)(sh.hq + 2 * sh.hk) * sh.d;
      const int64_t qk_bytes = 2LL * T * (sh.hq + sh.hk) * sh.rot * 2;
      const int64_t move = qk_bytes + T * 8LL + (int64_t)T * sh.rot * 4;
      int n_sets = (int)std::max<int64_t>(1, std::min<int64_t>(200, (120LL << 20) / move + 1));
      if (sets_arg > 0) n_sets = sets_arg;
      if (engine) n_sets = 200;
      // The engine sequence rotates positions only: its q/k are the one tensor the producer rewrites.
      const int n_qkv = engine ? 1 : n_sets;
      std::vector<__nv_bfloat16*> qkv(n_qkv);
      std::vector<int64_t*> pos(n_sets);
      std::vector<int4*> contig(n_qkv);
      const int64_t qkv_elems = row_elems * (int64_t)T;
      const int64_t contig16 = (qk_bytes / 2 + 15) / 16;
      for (int i = 0; i < n_sets; ++i) {
        if (i < n_qkv) {
          CK(cudaMalloc(&qkv[i], qkv_elems * 2));
          fill_bf16<<<2048, 256>>>(qkv[i], qkv_elems, rng());
          CK(cudaMalloc(&contig[i], contig16 * 16));
          CK(cudaMemset(contig[i], 1, contig16 * 16));
        }
        CK(cudaMalloc(&pos[i], T * 8));
        fill_pos<<<64, 256>>>(pos[i], T, rows, rng());
      }
      auto free_sets = [&] {
        for (auto* p : qkv) cudaFree(p);
        for (auto* p : pos) cudaFree(p);
        for (auto* p : contig) cudaFree(p);
      };
      auto params = [&](int i) {
        return fused_qkv_params(qkv[i % n_qkv], pos[i], cache, rows, T, sh.hq, sh.hk, sh.d, sh.rot, sh.neox);
      };
      if (T == 1024 || T == 8192) {  // correctness against a CPU float reference
        std::vector<__nv_bfloat16> before(qkv_elems), after(qkv_elems);
        std::vector<int64_t> hp(T);
        std::vector<float> hc((size_t)rows * sh.rot);
        CK(cudaMemcpy(before.data(), qkv[0], qkv_elems * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hp.data(), pos[0], T * 8, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hc.data(), cache, hc.size() * 4, cudaMemcpyDeviceToHost));
        RotaryParams p0 = params(0);
        if (launch_rotary_embedding(p0, nullptr, 0)) { printf("launch failed\n"); exit(1); }
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(after.data(), qkv[0], qkv_elems * 2, cudaMemcpyDeviceToHost));
        double worst = 0;
        int64_t changed_wrong = 0;
        const int half = sh.rot / 2;
        for (int t = 0; t < T; ++t) {
          const float* crow = &hc[(size_t)hp[t] * sh.rot];
          for (int h = 0; h < sh.hq + 2 * sh.hk; ++h) {
            const int64_t base = (int64_t)t * row_elems + (int64_t)h * sh.d;
            for (int e = 0; e < sh.d; ++e) {
              float want = __bfloat162float(before[base + e]);
              if (h < sh.hq + sh.hk && e < sh.rot) {
                int i = sh.neox ? (e % half) : e / 2;
                bool first = sh.neox ? e < half : e % 2 == 0;
                int pe = sh.neox ? (first ? e + half : e - half) : (first ? e + 1 : e - 1);
                float x = __bfloat162float(before[base + e]), y = __bfloat162float(before[base + pe]);
                want = first ? x * crow[i] - y * crow[half + i] : x * crow[i] + y * crow[half + i];
              }
              float got = __bfloat162float(after[base + e]);
              if (h >= sh.hq + sh.hk || e >= sh.rot) { if (got != want) ++changed_wrong; continue; }
              worst = std::max(worst, (double)fabsf(got - want));
            }
          }
        }
        printf("%-20s %7d  check: max abs err %.3g, pass-through changed %lld -> %s\n", sh.name, T, worst,
               (long long)changed_wrong, worst < 0.05 && changed_wrong == 0 ? "OK" : "FAIL");
        CK(cudaMemcpy(qkv[0], before.data(), qkv_elems * 2, cudaMemcpyHostToDevice));
      }
      auto call = [&](int i, cudaStream_t s) {
        RotaryParams p = params(i);
        int err = launch_rotary_embedding(p, s, 0);
        if (err) { printf("launch error %d\n", err); exit(1); }
      };
      if (engine) {
        const unsigned fill_blocks = (unsigned)std::min<int64_t>(2048, (qkv_elems + 255) / 256);
        auto before = [&](int i, cudaStream_t s) {
          evict_read<<<num_sms(0) * 8, 256, 0, s>>>(evict, evict16, reinterpret_cast<int*>(evict));
          fill_bf16<<<fill_blocks, 256, 0, s>>>(qkv[0], qkv_elems, 1000 + i);
        };
        const float alone1 = time_graph(n_sets, before);
        const float with = time_graph(n_sets, [&](int i, cudaStream_t s) { before(i, s); call(i, s); });
        const float with_empty = time_graph(n_sets, [&](int i, cudaStream_t s) {
          before(i, s);
          launch_like_kernel(empty_dependent, 1, s);
        });
        const float alone2 = time_graph(n_sets, before);
        CK(cudaDeviceSynchronize());
        const float alone = (alone1 + alone2) / 2;
        printf("%-20s %7d  kernel %9.2f us in the engine sequence, empty kernel %5.2f (%.2f with it, %.2f with the "
               "empty one, %.2f and %.2f without)\n",
               sh.name, T, with - alone, with_empty - alone, with, with_empty, alone1, alone2);
        fflush(stdout);
        free_sets();
        continue;
      }
      float k_us = time_graph(n_sets, call);
      CK(cudaDeviceSynchronize());
      if (!floors) {
        printf("%-20s %7d  kernel %9.2f us  %5.2f TB/s\n", sh.name, T, k_us, move / k_us * 1e-6);
      } else {
        const int chunks = sh.rot * 2 / 16;
        const int64_t pat_threads = (int64_t)T * (sh.hq + sh.hk) * chunks;
        float pat_us = time_graph(n_sets, [&](int i, cudaStream_t s) {
          touch_pattern<<<(unsigned)((pat_threads + 255) / 256), 256, 0, s>>>(
              (char*)qkv[i], T, sh.hq + sh.hk, chunks, row_elems * 2, sh.d * 2, 0);
        });
        float con_us = time_graph(n_sets, [&](int i, cudaStream_t s) {
          touch_contig<<<(unsigned)((contig16 + 1023) / 1024), 256, 0, s>>>(contig[i], contig16, 0);
        });
        printf("%-20s %7d  kernel %9.2f us  %5.2f TB/s | pattern %9.2f | contig %9.2f | k/pat %.3f k/contig %.3f\n",
               sh.name, T, k_us, move / k_us * 1e-6, pat_us, con_us, pat_us / k_us, con_us / k_us);
        if (T <= 128) {  // chain's one thread per q/k chunk re-reads each row: no floor beyond
          const float empty_us = time_graph(n_sets, [&](int, cudaStream_t s) {
            launch_like_kernel(empty_dependent, 1, s);
          });
          const float chain_us = time_graph(n_sets, [&](int i, cudaStream_t s) {
            launch_like_kernel(chain_dependent, pat_threads, s, pos[i], cache, (int64_t)T,
                               (sh.hq + sh.hk) * chunks, sh.rot, sink);
          });
          const float patd_us = time_graph(n_sets, [&](int i, cudaStream_t s) {
            launch_like_kernel(touch_pattern<true>, pat_threads, s, (char*)qkv[i], (int64_t)T, sh.hq + sh.hk,
                               chunks, row_elems * 2, (int64_t)sh.d * 2, 0);
          });
          printf("%-20s %7d  decode floors, launched like the kernel: empty %5.2f | chain %5.2f | pattern %5.2f us"
                 " | kernel %5.2f\n", sh.name, T, empty_us, chain_us, patd_us, k_us);
        }
        if (floors >= 2) {
          static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
          if (encode == nullptr) {
            cudaDriverEntryPointQueryResult found;
            CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000,
                                                cudaEnableDefault, &found));
          }
          const int heads = sh.hq + sh.hk, stages = 6;
          float best = 1e30f;
          int best_tb = 0, best_bps = 0;
          for (int tb : {2, 4}) {
            const int box_bytes = sh.rot * 2 * heads * tb;
            if (box_bytes * stages > 200 * 1024 || heads > 256 || sh.rot > 256) continue;
            CK(cudaFuncSetAttribute(bulk_touch, cudaFuncAttributeMaxDynamicSharedMemorySize, box_bytes * stages));
            std::vector<CUtensorMap> maps(n_sets);
            for (int i = 0; i < n_sets; ++i) {
              cuuint64_t dims[3] = {(cuuint64_t)sh.d, (cuuint64_t)(sh.hq + 2 * sh.hk), (cuuint64_t)T};
              cuuint64_t strides[2] = {(cuuint64_t)sh.d * 2, (cuuint64_t)row_elems * 2};
              cuuint32_t box[3] = {(cuuint32_t)sh.rot, (cuuint32_t)heads, (cuuint32_t)tb}, unit[3] = {1, 1, 1};
              if (encode(&maps[i], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, qkv[i], dims, strides, box, unit,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
                printf("tensor map encoding failed\n");
                exit(1);
              }
            }
            const int tiles = (T + tb - 1) / tb;
            for (int bps : {2, 4}) {
              const int grid = std::min(tiles, num_sms(0) * bps);
              float us = time_graph(n_sets, [&](int i, cudaStream_t s) {
                bulk_touch<<<grid, 32, box_bytes * stages, s>>>(maps[i], tiles, tb, stages, box_bytes);
              });
              if (us < best) best = us, best_tb = tb, best_bps = bps;
            }
          }
          if (best_tb > 0)
            printf("%-20s %7d  bulk %9.2f us (%d tokens a box, %d blocks an SM) | k/bulk %.3f\n", sh.name, T, best,
                   best_tb, best_bps, best / k_us);
        }
      }
      fflush(stdout);
      free_sets();
    }
    cudaFree(cache);
  }
  if (evict) cudaFree(evict);
  cudaFree(sink);
  return 0;
}
