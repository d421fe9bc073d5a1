// Shared by the standalone benchmarks of studies/ (kernel_floors.cu, partial_floor.cu,
// decode_floor.cu, mrope_vs_plain.cu, fused_floor.cu): the CUDA error check, the graph timing
// they all report, the check that an in-place test pass flipped exactly the bytes it should,
// a launch that copies the kernel's own (csrc/kernel_common.cuh, launch_pdl), so that the
// floors are launched as the kernel is without reaching into its source, and the kernels that
// fill inputs on the device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                 \
  do {                                                                        \
    cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                  \
      printf("CUDA error %s at line %d\n", cudaGetErrorString(e_), __LINE__); \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

// Median microseconds per call of `call(set, stream)`: CUDA-graph replays of 20 calls each,
// enough graphs that every one of the n_sets input sets is used in turn (so a call does not
// find its inputs in the L2 the previous call filled), 7 to 60 replays after a warm-up.
template <typename F>
float time_graph(int n_sets, F&& call) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < std::max(n_sets, 3); ++i) call(i % n_sets, s);
  CK(cudaStreamSynchronize(s));
  const int per_graph = 20;
  int n_graphs = (n_sets + per_graph - 1) / per_graph;
  std::vector<cudaGraphExec_t> execs;
  for (int g = 0; g < n_graphs; ++g) {
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < per_graph; ++c) call((g * per_graph + c) % n_sets, s);
    CK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t e;
    CK(cudaGraphInstantiate(&e, graph, 0));
    execs.push_back(e);
    CK(cudaGraphDestroy(graph));
  }
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  auto replay = [&] {
    CK(cudaEventRecord(a, s));
    for (auto e : execs) CK(cudaGraphLaunch(e, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms / (n_graphs * per_graph) * 1e3f;
  };
  replay();
  float first = replay();
  int reps = std::max(7, std::min(60, (int)(150e3 / std::max(first * n_graphs * per_graph, 1.f))));
  std::vector<float> v;
  for (int r = 0; r < reps; ++r) v.push_back(replay());
  std::sort(v.begin(), v.end());
  for (auto e : execs) cudaGraphExecDestroy(e);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  return v[v.size() / 2];
}

// Bytes of `after` that differ from what an in-place pass over rows of `row_bytes` should leave:
// in each of the first `heads` heads of `head_bytes`, the first byte of every `width`-byte chunk
// of the first `rot_bytes` xored with 1 (the pass flips bit 0 of each chunk's first word),
// everything else as in `before`.
inline int64_t wrong_flips(const std::vector<unsigned char>& before, const std::vector<unsigned char>& after,
                           int64_t row_bytes, int64_t head_bytes, int heads, int64_t rot_bytes, int width) {
  int64_t wrong = 0;
  for (size_t k = 0; k < before.size(); ++k) {
    const int64_t e = (int64_t)(k % row_bytes), h = e / head_bytes, inner = e % head_bytes;
    const bool flipped = h < heads && inner < rot_bytes && inner % width == 0;
    wrong += after[k] != (flipped ? before[k] ^ 1 : before[k]);
  }
  return wrong;
}

// What the kernel does first under programmatic dependent launch (PDL): let the next kernel
// launch now, and wait for the previous one's writes.
__device__ __forceinline__ void pdl_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

inline int num_sms(int dev) {
  int n = 0;
  CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

// PDL on sm_90 and newer unless ROPE_COMPAT_PDL=0, as the kernel decides.
inline bool pdl_enabled(int dev) {
  const char* env = std::getenv("ROPE_COMPAT_PDL");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  int major = 0;
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 9;
}

// `threads` threads of `kernel` on device 0, launched as the kernel launches itself: blocks of
// 256 threads, halved down to 64 while the grid would leave multiprocessors idle, with PDL.
template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), int64_t threads, cudaStream_t s, const Args&... args) {
  static const int sms = num_sms(0);
  static const bool pdl = pdl_enabled(0);
  int block = 256;
  while (block > 64 && (threads + block - 1) / block < sms) block /= 2;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>((threads + block - 1) / block));
  config.blockDim = dim3(block);
  config.stream = s;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// Token counts from argv[1] ("1,16,128"), else `defaults`.
inline std::vector<int> token_counts(int argc, char** argv, std::vector<int> defaults) {
  if (argc <= 1) return defaults;
  std::vector<int> out;
  for (char* t = strtok(argv[1], ","); t; t = strtok(nullptr, ",")) out.push_back(atoi(t));
  return out;
}

// Inputs filled on the device (a hash of the index and a seed): values in [-1, 1], indices in
// [0, rows).
__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return x;
}
__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = __float2bfloat16((float)(mix(i * 2654435761ULL + seed) % 2001) / 1000.f - 1.f);
}
__global__ void fill_f32(float* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = (float)(mix(i * 2654435761ULL + seed) % 2001) / 1000.f - 1.f;
}
__global__ void fill_pos(int64_t* p, int64_t n, int64_t rows, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = (int64_t)(mix(i * 2654435761ULL + seed) % rows);
}
