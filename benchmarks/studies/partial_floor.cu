// Partial rotation: is the floor of its access pattern a limit of the memory, or of one kernel?
//
// With rot 64 of a 128-dim head (or of a 256-dim GPT-J head) only 128 bytes of every 256 (or
// 512) of q and k must move. kernel_floors.cu times one streaming pass over exactly those bytes
// (one thread per 16-byte chunk) and finds it 15-17% slower than a contiguous pass over as many
// bytes. This file times many passes over the same rotated bytes, differing in how threads map to
// chunks, how many loads a thread keeps in flight, block size, grid shape, traversal order and
// cache hints, plus the read-only and write-only halves of the pass, to see whether any of them
// gets closer to the contiguous figure. None reads positions or cos/sin rows, which a kernel must
// also do. A pass loads each chunk, flips a bit, and stores it back.
//
// bf16 q/k sliced from a fused qkv tensor (q heads, k heads, v heads per token), timed with
// floors.cuh's time_graph (CUDA-graph replays of 20 calls, every input set in turn) over input
// sets that together exceed 256 MiB.
// Results and what they mean: results/h200_partial_floor.txt.
// Build and run on a CUDA machine (no torch needed):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/partial_floor benchmarks/studies/partial_floor.cu
//   /tmp/partial_floor [tokens,...]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "floors.cuh"

using Call = std::function<void(int, cudaStream_t)>;

// Where the rotated chunks lie: token t, head h (q heads then k heads), chunk c of `chunks`.
struct Layout {
  char* base;
  int64_t tokens, tok_stride, head_stride;
  int heads, chunks;
  __device__ __forceinline__ int64_t total() const { return tokens * heads * chunks; }
  __device__ __forceinline__ int4* at(int64_t t, int h, int c) const {
    return reinterpret_cast<int4*>(base + t * tok_stride + h * head_stride) + c;
  }
};

enum Hint { kStream, kGlobal, kDefault };

template <Hint H>
__device__ __forceinline__ int4 ld(const int4* p) {
  if constexpr (H == kStream) return __ldcs(p);
  else if constexpr (H == kGlobal) return __ldcg(p);
  else return *p;
}
template <Hint H>
__device__ __forceinline__ void st(int4* p, int4 v) {
  if constexpr (H == kStream) __stcs(p, v);
  else if constexpr (H == kGlobal) __stcg(p, v);
  else *p = v;
}

// Chunk index i in token-major order (token, head, chunk): the kernel's order.
__device__ __forceinline__ int4* token_major(const Layout& l, int64_t i) {
  const int64_t per_tok = (int64_t)l.heads * l.chunks;
  const int64_t t = i / per_tok;
  const int r = (int)(i - t * per_tok);
  return l.at(t, r / l.chunks, r % l.chunks);
}

// K chunks a thread, `stride` chunks apart, all loads issued before any store.
template <int K, Hint H>
__global__ void pass_unrolled(Layout l) {
  const int64_t first = (int64_t)blockIdx.x * blockDim.x * K + threadIdx.x;
  int4* p[K];
  int4 v[K];
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const int64_t i = first + u * (int64_t)blockDim.x;
    p[u] = i < l.total() ? token_major(l, i) : nullptr;
    if (p[u]) v[u] = ld<H>(p[u]);
  }
#pragma unroll
  for (int u = 0; u < K; ++u)
    if (p[u]) {
      v[u].x ^= 1;
      st<H>(p[u], v[u]);
    }
}

// A fixed grid walks all chunks, 4 in flight per thread.
__global__ void pass_persistent(Layout l) {
  const int64_t n = l.total(), step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i0 < n; i0 += 4 * step) {
    int4* p[4];
    int4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t i = i0 + u * step;
      p[u] = i < n ? token_major(l, i) : nullptr;
      if (p[u]) v[u] = __ldcs(p[u]);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (p[u]) {
        v[u].x ^= 1;
        __stcs(p[u], v[u]);
      }
  }
}

// One thread per head: its chunks are contiguous, so a warp's load touches 32 heads at once.
__global__ void pass_per_head(Layout l) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= l.tokens * l.heads) return;
  const int64_t t = i / l.heads;
  const int h = (int)(i - t * l.heads);
  int4 v[16];
#pragma unroll
  for (int c = 0; c < 16; ++c)
    if (c < l.chunks) v[c] = __ldcs(l.at(t, h, c));
#pragma unroll
  for (int c = 0; c < 16; ++c)
    if (c < l.chunks) {
      v[c].x ^= 1;
      __stcs(l.at(t, h, c), v[c]);
    }
}

// Other orders: kTile tokens of one head side by side (order: token tile, head, token, chunk);
// kTile = 0 is head-major over all tokens (order: head, token, chunk).
template <int kTile>
__global__ void pass_order(Layout l) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (kTile == 0 && i >= l.total()) return;
  int64_t t;
  int h, c = (int)(i % l.chunks);
  const int64_t r = i / l.chunks;
  if constexpr (kTile == 0) {
    h = (int)(r / l.tokens);
    t = r - (int64_t)h * l.tokens;
  } else {
    const int64_t tile = r / (kTile * l.heads);
    const int rem = (int)(r - tile * kTile * l.heads);
    h = rem / kTile;
    t = tile * kTile + rem % kTile;
    if (t >= l.tokens) return;
  }
  int4* p = l.at(t, h, c);
  int4 v = __ldcs(p);
  v.x ^= 1;
  __stcs(p, v);
}

// The two halves of a pass: loads only (folded so that they are not dropped), stores only.
__global__ void pass_read(Layout l, int* sink) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= l.total()) return;
  const int4 v = __ldcs(token_major(l, i));
  if ((v.x ^ v.y ^ v.z ^ v.w) == 0x7fffffff) *sink = v.x;  // never in practice
}
__global__ void pass_write(Layout l) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= l.total()) return;
  const int x = (int)i;
  __stcs(token_major(l, i), make_int4(x, x, x, x));
}

// The contiguous references over as many bytes: read and write, read only, write only.
__global__ void contig_rw(int4* p, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int4 v = __ldcs(p + i);
  v.x ^= 1;
  __stcs(p + i, v);
}
__global__ void contig_read(const int4* p, int64_t n, int* sink) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int4 v = __ldcs(p + i);
  if ((v.x ^ v.y ^ v.z ^ v.w) == 0x7fffffff) *sink = v.x;
}
__global__ void contig_write(int4* p, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int x = (int)i;
  __stcs(p + i, make_int4(x, x, x, x));
}

unsigned blocks_for(int64_t threads, int block) { return (unsigned)((threads + block - 1) / block); }

struct Shape {
  const char* name;
  int hq, hk, d, rot;
};

int main(int argc, char** argv) {
  std::vector<int64_t> token_list = {1000, 8192, 32768, 131072};
  if (argc > 1) {
    token_list.clear();
    for (char* t = strtok(argv[1], ","); t; t = strtok(nullptr, ",")) token_list.push_back(atoll(t));
  }
  const Shape shapes[] = {{"32/32x128 rot64", 32, 32, 128, 64}, {"16/16x256 rot64", 16, 16, 256, 64},
                          {"32/8x128 rot128", 32, 8, 128, 128}};
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int* sink;
  CK(cudaMalloc(&sink, 4));
  for (const Shape& sh : shapes) {
    for (int64_t T : token_list) {
      const int64_t row_bytes = (int64_t)(sh.hq + 2 * sh.hk) * sh.d * 2;
      const int heads = sh.hq + sh.hk, chunks = sh.rot * 2 / 16;
      const int64_t n16 = T * heads * chunks, bytes = n16 * 16;
      const int n_sets = (int)std::max<int64_t>(2, ((256LL << 20) + bytes - 1) / bytes);
      std::vector<char*> qkv(n_sets);
      std::vector<int4*> flat(n_sets);
      for (int i = 0; i < n_sets; ++i) {
        CK(cudaMalloc(&qkv[i], T * row_bytes));
        CK(cudaMemset(qkv[i], 0x3c, T * row_bytes));
        CK(cudaMalloc(&flat[i], bytes));
        CK(cudaMemset(flat[i], 0x3c, bytes));
      }
      auto layout = [&](int i) { return Layout{qkv[i], T, row_bytes, (int64_t)sh.d * 2, heads, chunks}; };
      struct Variant {
        std::string name;
        Call call;
      };
      std::vector<Variant> vs;
      vs.push_back({"contiguous, 1 chunk a thread", [&](int i, cudaStream_t s) {
                      contig_rw<<<blocks_for(n16, 256), 256, 0, s>>>(flat[i], n16);
                    }});
      vs.push_back({"contiguous, read only", [&](int i, cudaStream_t s) {
                      contig_read<<<blocks_for(n16, 256), 256, 0, s>>>(flat[i], n16, sink);
                    }});
      vs.push_back({"contiguous, write only", [&](int i, cudaStream_t s) {
                      contig_write<<<blocks_for(n16, 256), 256, 0, s>>>(flat[i], n16);
                    }});
      for (int block : {128, 256, 512, 1024}) {
        vs.push_back({"rotated, 1 chunk a thread, block " + std::to_string(block), [&, block](int i, cudaStream_t s) {
                        pass_unrolled<1, kStream><<<blocks_for(n16, block), block, 0, s>>>(layout(i));
                      }});
      }
      vs.push_back({"rotated, 2 chunks a thread", [&](int i, cudaStream_t s) {
                      pass_unrolled<2, kStream><<<blocks_for(n16, 512), 256, 0, s>>>(layout(i));
                    }});
      vs.push_back({"rotated, 4 chunks a thread", [&](int i, cudaStream_t s) {
                      pass_unrolled<4, kStream><<<blocks_for(n16, 1024), 256, 0, s>>>(layout(i));
                    }});
      vs.push_back({"rotated, 8 chunks a thread", [&](int i, cudaStream_t s) {
                      pass_unrolled<8, kStream><<<blocks_for(n16, 2048), 256, 0, s>>>(layout(i));
                    }});
      for (int bps : {4, 8, 16}) {
        vs.push_back({"rotated, persistent, " + std::to_string(bps) + " blocks an SM", [&, bps](int i, cudaStream_t s) {
                        pass_persistent<<<sms * bps, 256, 0, s>>>(layout(i));
                      }});
      }
      vs.push_back({"rotated, one thread a head", [&](int i, cudaStream_t s) {
                      pass_per_head<<<blocks_for(T * heads, 128), 128, 0, s>>>(layout(i));
                    }});
      vs.push_back({"rotated, 4 tokens of a head side by side", [&](int i, cudaStream_t s) {
                      pass_order<4><<<blocks_for(((T + 3) / 4) * 4 * heads * chunks, 256), 256, 0, s>>>(layout(i));
                    }});
      vs.push_back({"rotated, head-major", [&](int i, cudaStream_t s) {
                      pass_order<0><<<blocks_for(n16, 256), 256, 0, s>>>(layout(i));
                    }});
      vs.push_back({"rotated, cache-global hints", [&](int i, cudaStream_t s) {
                      pass_unrolled<1, kGlobal><<<blocks_for(n16, 256), 256, 0, s>>>(layout(i));
                    }});
      vs.push_back({"rotated, default hints", [&](int i, cudaStream_t s) {
                      pass_unrolled<1, kDefault><<<blocks_for(n16, 256), 256, 0, s>>>(layout(i));
                    }});
      vs.push_back({"rotated, read only", [&](int i, cudaStream_t s) {
                      pass_read<<<blocks_for(n16, 256), 256, 0, s>>>(layout(i), sink);
                    }});
      vs.push_back({"rotated, write only", [&](int i, cudaStream_t s) {
                      pass_write<<<blocks_for(n16, 256), 256, 0, s>>>(layout(i));
                    }});
      printf("\n%s, %lld tokens: %.1f MB rotated q/k each way, %d input sets\n", sh.name, (long long)T, bytes / 1e6,
             n_sets);
      // Each read-and-write pass must flip every rotated chunk exactly once and touch nothing else.
      if (T <= 8192) {
        std::vector<unsigned char> before(T * row_bytes), after(T * row_bytes);
        CK(cudaMemcpy(before.data(), qkv[0], T * row_bytes, cudaMemcpyDeviceToHost));
        for (const Variant& v : vs) {
          if (v.name.rfind("rotated", 0) != 0 || v.name.find("only") != std::string::npos) continue;
          v.call(0, 0);
          CK(cudaDeviceSynchronize());
          CK(cudaMemcpy(after.data(), qkv[0], T * row_bytes, cudaMemcpyDeviceToHost));
          const int64_t wrong = wrong_flips(before, after, row_bytes, sh.d * 2, heads, sh.rot * 2, 16);
          if (wrong) {
            printf("  %s: %lld bytes wrong\n", v.name.c_str(), (long long)wrong);
            exit(1);
          }
          CK(cudaMemcpy(qkv[0], before.data(), T * row_bytes, cudaMemcpyHostToDevice));
        }
        printf("  check: every read-and-write pass flips each rotated chunk once and nothing else\n");
      }
      float contig = 0, best = 1e30f;
      std::string best_name;
      for (const Variant& v : vs) {
        const float us = time_graph(n_sets, v.call);
        const bool rw = v.name.find("only") == std::string::npos;
        const double moved = rw ? 2.0 * bytes : 1.0 * bytes;
        if (contig == 0) contig = us;  // the first variant: contiguous, read and write
        if (rw && v.name.rfind("rotated", 0) == 0 && us < best) best = us, best_name = v.name;
        printf("  %-44s %9.2f us  %5.2f TB/s  x contiguous %.3f\n", v.name.c_str(), us, moved / us * 1e-6,
               us / contig);
        fflush(stdout);
      }
      printf("  best rotated pass: %s, %.2f us, %.3f x contiguous\n", best_name.c_str(), best, best / contig);
      CK(cudaDeviceSynchronize());
      for (int i = 0; i < n_sets; ++i) {
        CK(cudaFree(qkv[i]));
        CK(cudaFree(flat[i]));
      }
    }
  }
  CK(cudaFree(sink));
  return 0;
}
