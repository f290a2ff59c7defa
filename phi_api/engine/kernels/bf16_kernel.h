// The BF16-weight matrix kernel, for the float32 matrices a quantized model keeps (the default model's down
// projections), shared by the ctypes entry (q4_vnni.cpp: tests) and the custom operator (ops.cpp: serving).
// Y[M, N] = X[M, K] . W[K, N], W stored as bfloat16 (half the bytes of float32), X and the sums in float32: each
// tile of weights is widened to float32 in registers (a bfloat16 is the top half of its float32) and multiplied with
// FMAs. Rounding the weights alone changed neither the default model's greedy answers nor its perplexity; rounding
// its activations to bfloat16 as well (AVX-512 BF16's vdpbf16ps) flipped answers as int8 rows did (docs/quality.md).
//
// Packed weights (pack_bf16 in reference.py): for each group of 16 columns, each pair of K values, 64 bytes: lane c
// holds column c's values K = 2p (low half) and 2p + 1 (high half). As in q4_kernel.h each tile is loaded (and
// widened) once and multiplied into every row (up to 8) of the pass, each row's values coming as broadcasts.
// Each row is summed in one fixed order (two chains: even and odd values of K, added at the end) whatever the number
// of rows: a row's result does not depend on the others, and several tokens of a row come out as one-token steps'.
#pragma once
#include <immintrin.h>
#include <cstdint>

namespace bf16 {

constexpr int kMaxRows = 8;  // 16 accumulators (two chains a row) and 4 widened tiles stay in registers
constexpr int kPrefetchBytes = 4096;

// Columns [g0 * 16, g1 * 16) of Y for M rows (known when compiling: the accumulators stay in registers).
template <int M>
inline void columns(const uint16_t* w, const float* x, float* y, int k, int n, int g0, int g1) {
  const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int g = g0; g < g1; ++g) {
    __m512 even[kMaxRows], odd[kMaxRows];
    for (int r = 0; r < M; ++r) even[r] = odd[r] = _mm512_setzero_ps();
    const uint16_t* tile = w + static_cast<size_t>(g) * k * 16;
    for (int i = 0; i < k; i += 4, tile += 64) {  // two tiles: K = i .. i + 3
      _mm_prefetch(reinterpret_cast<const char*>(tile) + kPrefetchBytes, _MM_HINT_T0);
      const __m512i first = _mm512_loadu_si512(tile), second = _mm512_loadu_si512(tile + 32);
      const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(first, 16));
      const __m512 w1 = _mm512_castsi512_ps(_mm512_and_si512(first, high));
      const __m512 w2 = _mm512_castsi512_ps(_mm512_slli_epi32(second, 16));
      const __m512 w3 = _mm512_castsi512_ps(_mm512_and_si512(second, high));
      for (int r = 0; r < M; ++r) {
        const float* a = x + static_cast<size_t>(r) * k + i;
        even[r] = _mm512_fmadd_ps(w0, _mm512_set1_ps(a[0]), even[r]);
        odd[r] = _mm512_fmadd_ps(w1, _mm512_set1_ps(a[1]), odd[r]);
        even[r] = _mm512_fmadd_ps(w2, _mm512_set1_ps(a[2]), even[r]);
        odd[r] = _mm512_fmadd_ps(w3, _mm512_set1_ps(a[3]), odd[r]);
      }
    }
    for (int r = 0; r < M; ++r) _mm512_storeu_ps(y + static_cast<size_t>(r) * n + g * 16, _mm512_add_ps(even[r], odd[r]));
  }
}

using Part = void (*)(const uint16_t*, const float*, float*, int, int, int, int);

// The compiled loop for m rows (1 <= m <= kMaxRows); a switch for the reason given in q4_kernel.h's part_for.
inline Part part_for(int m) {
  switch (m) {
    case 1: return columns<1>;
    case 2: return columns<2>;
    case 3: return columns<3>;
    case 4: return columns<4>;
    case 5: return columns<5>;
    case 6: return columns<6>;
    case 7: return columns<7>;
    default: return columns<8>;
  }
}

// Columns [g0 * 16, g1 * 16) of Y for any number of rows, kMaxRows at a time: the weights of these columns stay in
// the cache from one pass to the next.
inline void all_rows(const uint16_t* w, const float* x, float* y, int64_t m, int k, int n, int g0, int g1) {
  for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
    const int rows = static_cast<int>(m - r0 < kMaxRows ? m - r0 : kMaxRows);
    part_for(rows)(w, x + r0 * k, y + r0 * n, k, n, g0, g1);
  }
}

}  // namespace bf16
