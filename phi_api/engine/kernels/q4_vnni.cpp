// The 4-bit and 8-bit kernel of q4_kernel.h behind a C function for ctypes (native.py): the tests compare it with the numpy
// reference and `phi-api bench kernels --ours` times it. OpenMP's workers share its columns here; the custom
// operator (ops.cpp) uses ONNX Runtime's own pool instead.
#include <omp.h>

#include <vector>

#include "bf16_kernel.h"
#include "q4_kernel.h"

namespace {

// The groups of 16 columns of Y shared among `threads` of OpenMP's threads, each calling part(g0, g1) for its own.
// OpenMP's workers wait between calls (a thread made per call costs tens of microseconds, as much as a call).
template <class Part>
void by_columns(int n, int threads, const Part& part) {
  const int groups = n / 16;
  threads = threads < 1 ? 1 : (threads > groups ? groups : threads);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), count = omp_get_num_threads();
    part(groups * t / count, groups * (t + 1) / count);
  }
}

}  // namespace

extern "C" {

// w: packed weights of `bits` (4 or 8); w_scales: [N / 16, blocks, 16] (a group of 16 columns' scales in one run);
// x: [M, K]; y: [M, N]. K and N multiples of 16, M >= 1 (kMaxRows at a time, as the operator goes). Returns 0, or -1
// for shapes it does not take.
int q4_matmul(const uint8_t* w, const float* w_scales, const float* x, float* y, int m, int k, int n, int bits,
              int threads) {
  if (m < 1 || k < 16 || k % 16 || n % 16 || (bits != 4 && bits != 8)) return -1;
  const int blocks = q4::block_count(k);
  std::vector<int8_t> q(static_cast<size_t>(m) * k);
  std::vector<float> a_scales(static_cast<size_t>(m) * blocks);
  std::vector<int32_t> a_sums(static_cast<size_t>(m) * blocks);
  q4::quantize_rows(x, m, k, q.data(), a_scales.data(), a_sums.data());
  const auto rows = bits == 4 ? q4::all_rows<4> : q4::all_rows<8>;
  by_columns(n, threads, [&](int g0, int g1) { rows(w, w_scales, q.data(), a_scales.data(), a_sums.data(), y, m, k, n, g0, g1); });
  return 0;
}

// w: bfloat16 weights in pack_bf16's layout; x: [M, K]; y: [M, N]. K and N multiples of 16, M >= 1. Returns 0, or
// -1 for shapes it does not take.
int bf16_matmul(const uint16_t* w, const float* x, float* y, int m, int k, int n, int threads) {
  if (m < 1 || k < 16 || k % 16 || n < 16 || n % 16) return -1;
  by_columns(n, threads, [&](int g0, int g1) { bf16::all_rows(w, x, y, m, k, n, g0, g1); });
  return 0;
}

}  // extern "C"
