// The machine's own limits, measured: the int8 dot-product peak (AVX-512 VNNI's vpdpbusd) and the read bandwidth.
// Built by phi_api/bench/roofline.py with g++ and called through ctypes; every thread of OpenMP's pool runs the loop.
//
// The peak: each thread keeps 16 independent chains of vpdpbusd (one 512-bit register each, 64 multiply-adds an
// instruction), so that no chain waits on its previous result; each chain starts from its own value, and the
// results are summed into what the call returns, so that the compiler can neither merge the chains nor drop them.
// The bandwidth: each thread sums its part of a buffer far larger than the caches with 512-bit loads, four
// accumulators deep.
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstring>

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

extern "C" {

int roofline_threads() { return omp_get_max_threads(); }

// Multiply-adds per second of `threads` threads doing `rounds` rounds of 16 chained vpdpbusd each; `checksum`
// receives a value that depends on every result.
double roofline_int8_macs(int threads, int64_t rounds, int64_t* checksum) {
  int64_t total = 0;
  const double start = now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int me = omp_get_thread_num();
    const __m512i a = _mm512_set1_epi8(static_cast<char>(3 + me));
    const __m512i b = _mm512_set1_epi8(static_cast<char>(-5 - me));
    __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2),
            c3 = _mm512_set1_epi32(3), c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5),
            c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7), c8 = _mm512_set1_epi32(8),
            c9 = _mm512_set1_epi32(9), c10 = _mm512_set1_epi32(10), c11 = _mm512_set1_epi32(11),
            c12 = _mm512_set1_epi32(12), c13 = _mm512_set1_epi32(13), c14 = _mm512_set1_epi32(14),
            c15 = _mm512_set1_epi32(15);
    for (int64_t i = 0; i < rounds; ++i) {
      c0 = _mm512_dpbusd_epi32(c0, a, b);
      c1 = _mm512_dpbusd_epi32(c1, a, b);
      c2 = _mm512_dpbusd_epi32(c2, a, b);
      c3 = _mm512_dpbusd_epi32(c3, a, b);
      c4 = _mm512_dpbusd_epi32(c4, a, b);
      c5 = _mm512_dpbusd_epi32(c5, a, b);
      c6 = _mm512_dpbusd_epi32(c6, a, b);
      c7 = _mm512_dpbusd_epi32(c7, a, b);
      c8 = _mm512_dpbusd_epi32(c8, a, b);
      c9 = _mm512_dpbusd_epi32(c9, a, b);
      c10 = _mm512_dpbusd_epi32(c10, a, b);
      c11 = _mm512_dpbusd_epi32(c11, a, b);
      c12 = _mm512_dpbusd_epi32(c12, a, b);
      c13 = _mm512_dpbusd_epi32(c13, a, b);
      c14 = _mm512_dpbusd_epi32(c14, a, b);
      c15 = _mm512_dpbusd_epi32(c15, a, b);
    }
    __m512i sum = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                                   _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
    sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)),
                                                 _mm512_add_epi32(_mm512_add_epi32(c12, c13), _mm512_add_epi32(c14, c15))));
    total += _mm512_reduce_add_epi32(sum);
  }
  const double seconds = now() - start;
  *checksum = total;
  return static_cast<double>(threads) * static_cast<double>(rounds) * 16.0 * 64.0 / seconds;
}

// Bytes per second of `threads` threads summing the `bytes` bytes at `buffer` (64-byte aligned, a multiple of 256
// bytes per thread); `checksum` receives the sum.
double roofline_read(const uint8_t* buffer, int64_t bytes, int threads, int64_t* checksum) {
  int64_t total = 0;
  const double start = now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int me = omp_get_thread_num();
    const int64_t part = bytes / threads / 256 * 256;
    const uint8_t* p = buffer + part * me;
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512(), s2 = _mm512_setzero_si512(),
            s3 = _mm512_setzero_si512();
    for (int64_t i = 0; i < part; i += 256) {
      s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + i));
      s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + i + 64));
      s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + i + 128));
      s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + i + 192));
    }
    total += _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
  }
  const double seconds = now() - start;
  *checksum = total;
  return static_cast<double>(bytes / threads / 256 * 256 * threads) / seconds;
}

}  // extern "C"
