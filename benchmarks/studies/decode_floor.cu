// Decode calls: how fast can any plain pass over their rotated q/k bytes be?
//
// kernel_floors.cu (floors mode) times one such pass launched as the kernel is: one thread per
// 16-byte chunk, programmatic dependent launch (PDL), small blocks. For 16 tokens of 64/8 heads x
// 128 it takes about 1.55 us, above the 1.5 us a decode call may take, before a single position
// or cos/sin row is read. This file times other ways of launching the same pass: blocks of 32 to
// 256 threads, 1, 2 or 4 chunks per thread (all loads issued before any store), 8-byte chunks,
// and without PDL, beside an empty kernel launched with PDL. A pass loads each chunk, flips a
// bit and stores it back; none reads positions or the cache, which the kernel must also do.
//
// bf16 q/k sliced from a fused qkv tensor, 200 input sets in rotation,
// timed with floors.cuh's time_graph (CUDA-graph replays of 20 calls, every input set in turn).
// Build and run on a CUDA machine (no torch needed):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/decode_floor benchmarks/studies/decode_floor.cu
//   /tmp/decode_floor [tokens,...]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "floors.cuh"

using Call = std::function<void(int, cudaStream_t)>;

// pdl_prologue (floors.cuh): as the kernel starts under PDL.

// The rotated chunks: token t, head h (q heads then k heads), chunk c of `chunks` per head.
struct Layout {
  char* base;
  int tokens, tok_stride, head_stride, heads, chunks;
};

template <typename VT>
__device__ __forceinline__ VT* chunk(const Layout& l, int i) {
  const int per_tok = l.heads * l.chunks;
  const int t = i / per_tok, r = i - t * per_tok;
  const int h = r / l.chunks, c = r - h * l.chunks;
  return reinterpret_cast<VT*>(l.base + (size_t)t * l.tok_stride + (size_t)h * l.head_stride) + c;
}
__device__ __forceinline__ int4 load(const int4* p) { return __ldcs(p); }
__device__ __forceinline__ int2 load(const int2* p) { return __ldcs(p); }
__device__ __forceinline__ void store(int4* p, int4 v) { __stcs(p, v); }
__device__ __forceinline__ void store(int2* p, int2 v) { __stcs(p, v); }

// K chunks per thread (i, i + n/K, ...), all loads before any store.
template <typename VT, int K, bool kPdl>
__global__ void pass(Layout l, int total) {
  if constexpr (kPdl) pdl_prologue();
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  const int per = (total + K - 1) / K;
  if (tid >= per) return;
  VT v[K];
  VT* p[K];
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const int i = tid + u * per;
    p[u] = i < total ? chunk<VT>(l, i) : nullptr;
    if (p[u]) v[u] = load(p[u]);
  }
#pragma unroll
  for (int u = 0; u < K; ++u)
    if (p[u]) {
      v[u].x ^= 1;
      store(p[u], v[u]);
    }
}

__global__ void empty_kernel() { pdl_prologue(); }

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), int threads, int block, bool with_pdl, cudaStream_t s, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((threads + block - 1) / block);
  config.blockDim = dim3(block);
  config.stream = s;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = with_pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&config, kernel, args...));
}

int main(int argc, char** argv) {
  const std::vector<int> token_list = token_counts(argc, argv, {1, 8, 16});
  struct Shape {
    const char* name;
    int hq, hk, d, rot;
  };
  const Shape shapes[] = {{"32/8x128 rot128", 32, 8, 128, 128}, {"64/8x128 rot128", 64, 8, 128, 128}};
  const int n_sets = 200;
  // The first graphs timed on an idle GPU run fast or slow by chance: a warm-up first.
  time_graph(n_sets, [](int, cudaStream_t s) { launch(empty_kernel, 1, 64, true, s); });
  for (const Shape& sh : shapes) {
    for (int T : token_list) {
      const int row_bytes = (sh.hq + 2 * sh.hk) * sh.d * 2, heads = sh.hq + sh.hk;
      std::vector<char*> qkv(n_sets);
      for (auto& p : qkv) {
        CK(cudaMalloc(&p, (size_t)T * row_bytes));
        CK(cudaMemset(p, 0x3c, (size_t)T * row_bytes));
      }
      printf("\n%s, %d tokens: %d KB of rotated q/k each way\n", sh.name, T, T * heads * sh.rot * 2 / 1024);
      struct Variant {
        std::string name;
        Call call;
      };
      std::vector<Variant> vs;
      vs.push_back({"empty kernel, PDL", [](int, cudaStream_t s) { launch(empty_kernel, 1, 64, true, s); }});
      auto add = [&](const std::string& name, auto kernel, int width, int per_thread, int block, bool with_pdl) {
        vs.push_back({name, [=, &qkv, &sh](int i, cudaStream_t s) {
                        const Layout l{qkv[i], T, row_bytes, sh.d * 2, heads, sh.rot * 2 / width};
                        const int total = T * heads * l.chunks;
                        launch(kernel, (total + per_thread - 1) / per_thread, block, with_pdl, s, l, total);
                      }});
      };
      for (int b : {32, 64, 128, 256}) add("16 B x 1 a thread, block " + std::to_string(b), pass<int4, 1, true>, 16, 1, b, true);
      for (int b : {32, 64, 128}) add("16 B x 2 a thread, block " + std::to_string(b), pass<int4, 2, true>, 16, 2, b, true);
      for (int b : {32, 64}) add("16 B x 4 a thread, block " + std::to_string(b), pass<int4, 4, true>, 16, 4, b, true);
      for (int b : {64, 128, 256}) add("8 B x 1 a thread, block " + std::to_string(b), pass<int2, 1, true>, 8, 1, b, true);
      add("8 B x 2 a thread, block 64", pass<int2, 2, true>, 8, 2, 64, true);
      add("16 B x 1 a thread, block 64, no PDL", pass<int4, 1, false>, 16, 1, 64, false);
      // Each pass must flip every rotated chunk exactly once and touch nothing else.
      {
        std::vector<unsigned char> before((size_t)T * row_bytes), after(before.size());
        CK(cudaMemcpy(before.data(), qkv[0], before.size(), cudaMemcpyDeviceToHost));
        for (const Variant& v : vs) {
          if (v.name.rfind("empty", 0) == 0) continue;
          const int width = v.name.rfind("8 B", 0) == 0 ? 8 : 16;
          v.call(0, 0);
          CK(cudaDeviceSynchronize());
          CK(cudaMemcpy(after.data(), qkv[0], after.size(), cudaMemcpyDeviceToHost));
          const int64_t wrong = wrong_flips(before, after, row_bytes, sh.d * 2, heads, sh.rot * 2, width);
          if (wrong) {
            printf("  %s: %lld bytes wrong\n", v.name.c_str(), (long long)wrong);
            exit(1);
          }
          CK(cudaMemcpy(qkv[0], before.data(), before.size(), cudaMemcpyHostToDevice));
        }
        printf("  check: every pass flips each rotated chunk once and nothing else\n");
      }
      float best = 1e30f;
      std::string best_name;
      for (const Variant& v : vs) {
        const float us = time_graph(n_sets, v.call);
        if (v.name.rfind("empty", 0) != 0 && us < best) best = us, best_name = v.name;
        printf("  %-38s %6.3f us\n", v.name.c_str(), us);
        fflush(stdout);
      }
      printf("  fastest pass: %s, %.3f us\n", best_name.c_str(), best);
      for (auto& p : qkv) CK(cudaFree(p));
    }
  }
  return 0;
}
