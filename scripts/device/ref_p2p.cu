// Raw CUDA reference for gdx's engine benchmark: cudaMemcpyPeerAsync GPU0->GPU1 loop timed with
// events (8 MiB / 64 MiB / 1 GiB, best of 3), both directions at once, D2H pinned ceiling, and the
// 8-byte copy + cudaStreamSynchronize p50. One JSON object per line. GB/s = 1e9 B/s.
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
static void emit(const char* k, double v, const char* u) { printf("{\"key\":\"%s\",\"value\":%.3f,\"unit\":\"%s\"}\n", k, v, u); fflush(stdout); }
int main() {
  const size_t GIB = 1ull << 30;
  void *a, *b, *h; cudaStream_t s0, s1; cudaEvent_t e0, e1, f0, f1;
  CK(cudaSetDevice(1)); CK(cudaMalloc(&b, GIB)); CK(cudaDeviceEnablePeerAccess(0, 0)); CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaEventCreate(&f0)); CK(cudaEventCreate(&f1));
  CK(cudaSetDevice(0)); CK(cudaMalloc(&a, GIB)); CK(cudaDeviceEnablePeerAccess(1, 0)); CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1)); CK(cudaMallocHost(&h, GIB));
  struct { size_t len; int reps; const char* key; } cs[] = {{8ull << 20, 400, "p2p_8MiB"}, {64ull << 20, 100, "p2p_64MiB"}, {GIB, 10, "p2p_1GiB"}};
  for (auto& c : cs) {
    float best = 1e30f;
    CK(cudaMemcpyPeerAsync(b, 1, a, 0, c.len, s0));
    for (int r = 0; r < 3; r++) {
      CK(cudaEventRecord(e0, s0));
      for (int i = 0; i < c.reps; i++) CK(cudaMemcpyPeerAsync(b, 1, a, 0, c.len, s0));
      CK(cudaEventRecord(e1, s0)); CK(cudaEventSynchronize(e1));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); best = std::min(best, ms);
    }
    emit(c.key, (double)c.len * c.reps / (best / 1e3) / 1e9, "GB/s");
  }
  { // both directions at once
    float best = 1e30f;
    for (int r = 0; r < 3; r++) {
      auto t = std::chrono::steady_clock::now();
      for (int i = 0; i < 10; i++) { CK(cudaMemcpyPeerAsync(b, 1, a, 0, GIB, s0)); CK(cudaMemcpyPeerAsync(a, 0, b, 1, GIB, s1)); }
      CK(cudaStreamSynchronize(s0)); CK(cudaStreamSynchronize(s1));
      float ms = std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - t).count(); best = std::min(best, ms);
    }
    emit("p2p_bidir_1GiB", 2.0 * GIB * 10 / (best / 1e3) / 1e9, "GB/s");
  }
  { // D2H pinned ceiling
    float best = 1e30f;
    for (int r = 0; r < 3; r++) {
      CK(cudaEventRecord(e0, s0));
      for (int i = 0; i < 4; i++) CK(cudaMemcpyAsync(h, a, GIB, cudaMemcpyDeviceToHost, s0));
      CK(cudaEventRecord(e1, s0)); CK(cudaEventSynchronize(e1));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); best = std::min(best, ms);
    }
    emit("d2h_pinned_1GiB", 4.0 * GIB / (best / 1e3) / 1e9, "GB/s");
  }
  { // 8-byte copy + sync
    std::vector<double> v;
    for (int i = 0; i < 21000; i++) {
      auto t = std::chrono::steady_clock::now();
      cudaMemcpyPeerAsync(b, 1, a, 0, 8, s0); cudaStreamSynchronize(s0);
      if (i >= 1000) v.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count());
    }
    std::sort(v.begin(), v.end());
    emit("p2p_8B_latency_p50", v[v.size() / 2], "us"); emit("p2p_8B_latency_p99", v[v.size() * 99 / 100], "us");
  }
  return 0;
}
