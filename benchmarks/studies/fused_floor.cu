// The fused rope + KV-cache store kernel against floors with its own access pattern, without
// torch: is the fraction of the contiguous floor it reaches (0.83-0.86 at 8192-32768 tokens)
// a limit of what the call must move, or of the kernel?
//
// For 32/8x128 and 64/8x128 (bf16 q/k/v sliced from a fused qkv tensor, float32 cache, random
// int64 positions, KV buffers of bf16 rows larger than 2.5x the L2 written at random rows
// cache_loc, CUDA-graph replays over input sets that together exceed 2.5x the L2) it prints:
//   fused:    launch_rotary_set_kv (csrc/fused_kv_store_kernel.cu), as the extension calls it;
//   fp8:      the same into float8_e4m3 buffers (no scale); fp8/s: with k_scale 0.5, v_scale 0.25;
//   hot:      the fused kernel writing the same rows (0..T-1) for every input set, so the rows it
//             stores to are in the L2 and their pages in the TLBs: what the scattered store's
//             misses cost at the end of the kernel's chain of loads;
//   rope:     launch_rotary_embedding on the same q/k (the rotation alone, no store);
//   pattern:  a trivial kernel that moves exactly the bytes the fused call must move, the same
//             way: one thread per 16-byte chunk; a q/k chunk of the rotated dims is loaded and
//             stored back, a k chunk also stored to its k_buffer row, a v chunk loaded and
//             stored to its v_buffer row (no positions, no cache rows, no arithmetic);
//   sorted:   the pattern with cache_loc = t (rows written in order, no scatter);
//   contig:   one in-place pass over a contiguous buffer of as many bytes moved (half read, half
//             written): the floor benchmarks/fused_kv_store.py reports.
// The last two columns are the fraction of each floor the fused kernel reaches (floor time /
// fused time). The fused kernel's results are tested elsewhere (tests/test_fused_kv_store.py).
//
// Build and run from the repository root on a CUDA machine (no torch needed):
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc -o /tmp/fused_floor benchmarks/studies/fused_floor.cu \
//       csrc/fused_kv_store_kernel.cu csrc/rotary_embedding_kernel.cu
//   /tmp/fused_floor [tokens,...]
#include "fused_kv_store.h"
#include "rotary_embedding.h"
#include "floors.cuh"
#include "qkv_params.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace rope_compat;

namespace {

constexpr int64_t kCacheRows = 131072;

// The fused call's bytes, moved as it moves them (see the header).
__global__ void pattern(int4* qkv, const int64_t* loc, int4* kbuf, int4* vbuf, int tokens, int hq, int hk,
                        int chunks_per_head) {
  pdl_prologue();
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  const int per_tok = (hq + 2 * hk) * chunks_per_head;
  if (i >= static_cast<int64_t>(tokens) * per_tok) return;
  const int t = static_cast<int>(i / per_tok), r = static_cast<int>(i - static_cast<int64_t>(t) * per_tok);
  int4* const src = qkv + static_cast<int64_t>(t) * per_tok + r;
  const int kv_chunk = r - hq * chunks_per_head;  // within k (then v) of the token
  if (kv_chunk < 0) {  // q: in place
    __stcs(src, __ldcs(src));
    return;
  }
  const int64_t row = loc[t];
  const int kv_row = hk * chunks_per_head;
  if (kv_chunk < kv_row) {  // k: in place and to its row
    const int4 v = __ldcs(src);
    __stcs(src, v);
    kbuf[row * kv_row + kv_chunk] = v;
  } else {  // v: to its row
    vbuf[row * kv_row + kv_chunk - kv_row] = __ldcs(src);
  }
}

__global__ void touch_contig(int4* p, int64_t n16) {
  pdl_prologue();
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n16) __stcs(p + i, __ldcs(p + i));
}

struct Shape {
  const char* name;
  int hq, hk, d;
};

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int> token_list = token_counts(argc, argv, {1, 16, 128, 1024, 8192, 32768});
  const Shape shapes[] = {{"32/8x128", 32, 8, 128}, {"64/8x128", 64, 8, 128}};
  int l2 = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, L2 %d MiB\n", prop.name, l2 >> 20);
  float* cache;
  CK(cudaMalloc(&cache, kCacheRows * 128 * 4));
  fill_f32<<<1024, 256>>>(cache, kCacheRows * 128, 3);

  printf("%-9s %7s %9s %9s %9s %9s %9s %9s %9s %9s %11s %11s\n", "shape", "tokens", "fused us", "fp8", "fp8/s", "hot",
         "rope", "pattern",
         "sorted",
         "contig", "of pattern", "of contig");
  for (const Shape& s : shapes) {
    const int64_t row = static_cast<int64_t>(s.hq + 2 * s.hk) * s.d, kv = static_cast<int64_t>(s.hk) * s.d;
    const int64_t moved = (2 * (s.hq + s.hk) * s.d + kv + 2 * kv) * 2;  // bytes per token
    for (int tokens : token_list) {
      const int64_t set_bytes = tokens * (row * 2 + 16) + tokens * moved / 2;
      const int n_sets = static_cast<int>(std::max<int64_t>(1, 5 * static_cast<int64_t>(l2) / 2 / set_bytes + 1));
      const int64_t rows = std::max<int64_t>(2 * tokens, 5 * static_cast<int64_t>(l2) / 2 / (kv * 2) + 1);
      __nv_bfloat16 *qkv, *kbuf, *vbuf, *flat;
      unsigned char *kbuf8, *vbuf8;
      int64_t *pos, *loc, *loc_sorted, *loc_hot;
      const int64_t n_qkv = n_sets * tokens * row, n_tok = static_cast<int64_t>(n_sets) * tokens;
      const int64_t n_flat = n_sets * tokens * moved / 4;  // elements: in place, half the bytes moved
      CK(cudaMalloc(&qkv, n_qkv * 2));
      CK(cudaMalloc(&kbuf, rows * kv * 2));
      CK(cudaMalloc(&vbuf, rows * kv * 2));
      CK(cudaMalloc(&flat, n_flat * 2));
      CK(cudaMalloc(&kbuf8, rows * kv));
      CK(cudaMalloc(&vbuf8, rows * kv));
      CK(cudaMemset(kbuf8, 0x38, rows * kv));
      CK(cudaMemset(vbuf8, 0x38, rows * kv));
      CK(cudaMalloc(&pos, n_tok * 8));
      CK(cudaMalloc(&loc, n_tok * 8));
      CK(cudaMalloc(&loc_sorted, n_tok * 8));
      CK(cudaMalloc(&loc_hot, n_tok * 8));
      fill_bf16<<<1024, 256>>>(qkv, n_qkv, 1);
      fill_bf16<<<1024, 256>>>(kbuf, rows * kv, 2);
      fill_bf16<<<1024, 256>>>(vbuf, rows * kv, 4);
      fill_bf16<<<1024, 256>>>(flat, n_flat, 5);
      fill_pos<<<1024, 256>>>(pos, n_tok, kCacheRows, 6);
      fill_pos<<<1024, 256>>>(loc, n_tok, rows, 7);
      CK(cudaGetLastError());
      // Sorted rows: each set's tokens write rows t of a set-specific window (as a prefill would).
      std::vector<int64_t> srt(n_tok);
      for (int64_t k = 0; k < n_tok; ++k) srt[k] = ((k / tokens) * tokens + k % tokens) % rows;
      CK(cudaMemcpy(loc_sorted, srt.data(), n_tok * 8, cudaMemcpyHostToDevice));
      for (int64_t k = 0; k < n_tok; ++k) srt[k] = k % tokens;
      CK(cudaMemcpy(loc_hot, srt.data(), n_tok * 8, cudaMemcpyHostToDevice));
      CK(cudaDeviceSynchronize());

      auto rotary_params = [&](int i) {
        return fused_qkv_params(qkv + i * tokens * row, pos + static_cast<int64_t>(i) * tokens, cache, kCacheRows,
                                tokens, s.hq, s.hk, s.d, s.d, true);
      };
      auto fused_into = [&](void* kb, void* vb, BufferDType bt, float ks = 1.f, float vs = 1.f,
                            const int64_t* locs = nullptr) {
        return [&, kb, vb, bt, ks, vs, locs](int i, cudaStream_t st) {
        __nv_bfloat16* base = qkv + i * tokens * row;
        const RotaryParams p = rotary_params(i);
        KvStoreParams k{};
        k.value = base + (s.hq + s.hk) * s.d;
        k.k_buffer = kb;
        k.v_buffer = vb;
        k.cache_loc = (locs ? locs : loc) + static_cast<int64_t>(i) * tokens;
        k.v_batch_stride = row * tokens;
        k.v_token_stride = row;
        k.v_head_stride = s.d;
        k.k_rows = k.v_rows = rows;
        k.k_row_stride = k.v_row_stride = kv;
        k.k_head_stride = k.v_head_stride_buf = s.d;
        k.head_size = s.d;
        k.k_scale = ks;
        k.v_scale = vs;
        k.k_inv_scale = 1.f / ks;
        k.v_inv_scale = 1.f / vs;
        k.buffer_dtype = bt;
        k.loc_int64 = true;
        CK(static_cast<cudaError_t>(launch_rotary_set_kv(p, k, st, 0)));
        };
      };
      const int chunks = s.d / 8;
      auto pattern_on = [&](const int64_t* l) {
        return [&, l](int i, cudaStream_t st) {
          CK(launch_dependent(pattern, static_cast<int64_t>(tokens) * (s.hq + 2 * s.hk) * chunks, st,
                              reinterpret_cast<int4*>(qkv + i * tokens * row), l + static_cast<int64_t>(i) * tokens,
                              reinterpret_cast<int4*>(kbuf), reinterpret_cast<int4*>(vbuf), tokens, s.hq, s.hk,
                              chunks));
        };
      };
      const int64_t per_set16 = tokens * moved / 4 * 2 / 16;
      auto contig = [&](int i, cudaStream_t st) {
        CK(launch_dependent(touch_contig, per_set16, st, reinterpret_cast<int4*>(flat) + i * per_set16, per_set16));
      };
      const float t_fused = time_graph(n_sets, fused_into(kbuf, vbuf, BufferDType::kBFloat16));
      const float t_rope = time_graph(n_sets, [&](int i, cudaStream_t st) {
        CK(static_cast<cudaError_t>(launch_rotary_embedding(rotary_params(i), st, 0)));
      });
      const float t_fp8 = time_graph(n_sets, fused_into(kbuf8, vbuf8, BufferDType::kFloat8E4M3));
      const float t_fp8s = time_graph(n_sets, fused_into(kbuf8, vbuf8, BufferDType::kFloat8E4M3, 0.5f, 0.25f));
      const float t_hot = time_graph(n_sets, fused_into(kbuf, vbuf, BufferDType::kBFloat16, 1.f, 1.f, loc_hot));
      const float t_pattern = time_graph(n_sets, pattern_on(loc));
      const float t_sorted = time_graph(n_sets, pattern_on(loc_sorted));
      const float t_contig = time_graph(n_sets, contig);
      printf("%-9s %7d %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %11.3f %11.3f\n", s.name, tokens, t_fused, t_fp8,
             t_fp8s, t_hot, t_rope, t_pattern,
             t_sorted, t_contig, t_pattern / t_fused, t_contig / t_fused);
      fflush(stdout);
      for (void* ptr : {(void*)qkv, (void*)kbuf, (void*)vbuf, (void*)flat, (void*)kbuf8, (void*)vbuf8, (void*)pos, (void*)loc, (void*)loc_sorted, (void*)loc_hot})
        CK(cudaFree(ptr));
    }
  }
  return 0;
}
