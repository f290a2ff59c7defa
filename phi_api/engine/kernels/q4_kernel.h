// The 4-bit and 8-bit matrix kernel itself, shared by the ctypes entry (q4_vnni.cpp: tests and benchmarks) and ONNX
// Runtime's custom operators (ops.cpp: serving). Y[M, N] = X[M, K] . W[K, N], W in blocks of 128 along K (the last
// one may be partial) with one float scale per (column, block) and the implicit zero point (8 for 4 bits, 128 for 8:
// MatMulNBits without zero points), X quantized to int8 per (row, block) as ONNX Runtime's accuracy level 4 does.
//
// Unlike MLAS, which walks each tile of weights once per pair of rows, each 64-byte tile of weights is loaded (and
// with 4 bits unpacked) once and multiplied into every row (up to 8) with AVX-512 VNNI: 16 columns across the lanes,
// 4 values of K in each lane, so a row costs one vpdpbusd per 4 values of K and its activations come as an embedded
// broadcast. Each row's sums are its own: a row's result does not depend on how many rows share the call.
//
// Packed weights (see repack in reference.py): for each group of 16 columns, each piece of K (8 values with 4 bits,
// 4 with 8), 64 bytes. With 4 bits, byte 4c + j holds column c's value K = 8p + j in its low nibble and K = 8p + 4 + j
// in its high nibble; with 8 bits, byte 4c + j holds its value K = 4p + j.
// Their scales: for each group of 16 columns, each block, the 16 columns' scales: a group's scales lie in one run,
// read in order as its tiles are. (Block-major scales, [blocks, N], put a group's scales of successive blocks N * 4
// bytes apart: no prefetcher followed them, and a step of 8 rows at Phi-3.5's shape took ~1.4x the time.)
#pragma once
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace q4 {


constexpr int kBlock = 128;
// Rows one pass multiplies: 8 accumulators and 8 sums stay in registers. At 16 GCC spilled them to the stack in
// the inner loop, and a prompt chunk (64 rows) in passes of 8 took ~0.8x the time it took in passes of 16.
constexpr int kMaxRows = 8;
// How far ahead of the tile being multiplied its stream of weights is fetched: the hardware prefetchers alone let
// the loads wait, and a step of 8 rows cost its memory time plus its compute time instead of the larger of the two.
constexpr int kPrefetchBytes = 4096;

// Values of K in a 64-byte tile of 16 columns: two nibbles a byte with 4 bits, one byte with 8.
template <int Bits>
constexpr int kPiece = Bits == 4 ? 8 : 4;

inline int block_count(int k) { return (k + kBlock - 1) / kBlock; }
inline int block_length(int k, int b) { return k - b * kBlock < kBlock ? k - b * kBlock : kBlock; }

// Rows of X quantized per block: int8 values, a float scale and the sum of the int8 values per (row, block).
// K a multiple of 16.
inline void quantize_rows(const float* x, int m, int k, int8_t* q, float* scales, int32_t* sums) {
  const int blocks = block_count(k);
  for (int r = 0; r < m; ++r) {
    for (int b = 0; b < blocks; ++b) {
      const float* src = x + static_cast<size_t>(r) * k + b * kBlock;
      const int length = block_length(k, b);
      __m512 amax = _mm512_setzero_ps();
      for (int i = 0; i < length; i += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(src + i)));
      const float largest = _mm512_reduce_max_ps(amax);
      const float scale = largest / 127.0f;
      const __m512 inverse = _mm512_set1_ps(largest != 0.0f ? 127.0f / largest : 0.0f);
      int8_t* dst = q + static_cast<size_t>(r) * k + b * kBlock;
      __m512i total = _mm512_setzero_si512();
      for (int i = 0; i < length; i += 16) {
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(src + i), inverse));  // to nearest even
        total = _mm512_add_epi32(total, v);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm512_cvtsepi32_epi8(v));
      }
      scales[r * blocks + b] = scale;
      sums[r * blocks + b] = _mm512_reduce_add_epi32(total);
    }
  }
}

// Columns [g0 * 16, g1 * 16) of Y for all M rows (M known when compiling: the accumulators stay in registers).
template <int M, int Bits>
inline void columns(const uint8_t* w, const float* w_scales, const int8_t* q, const float* a_scales, const int32_t* a_sums,
             float* y, int k, int n, int g0, int g1) {
  constexpr int m = M;
  constexpr int zero = 1 << (Bits - 1);
  const int blocks = block_count(k);
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int g = g0; g < g1; ++g) {
    __m512 out[kMaxRows];
    for (int r = 0; r < m; ++r) out[r] = _mm512_setzero_ps();
    const uint8_t* tile = w + static_cast<size_t>(g) * (k / kPiece<Bits>) * 64;
    for (int b = 0; b < blocks; ++b) {
      __m512i acc[kMaxRows];
      for (int r = 0; r < m; ++r) acc[r] = _mm512_setzero_si512();
      const int8_t* qb = q + b * kBlock;
      const int pieces = block_length(k, b) / kPiece<Bits>;
      for (int p = 0; p < pieces; ++p, tile += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(tile) + kPrefetchBytes, _MM_HINT_T0);
        const __m512i packed = _mm512_loadu_si512(tile);
        if constexpr (Bits == 4) {
          const __m512i first = _mm512_and_si512(packed, low);
          const __m512i second = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
          for (int r = 0; r < m; ++r) {
            const int8_t* a = qb + static_cast<size_t>(r) * k + p * 8;
            int32_t a0, a1;
            std::memcpy(&a0, a, 4);
            std::memcpy(&a1, a + 4, 4);
            acc[r] = _mm512_dpbusd_epi32(acc[r], first, _mm512_set1_epi32(a0));
            acc[r] = _mm512_dpbusd_epi32(acc[r], second, _mm512_set1_epi32(a1));
          }
        } else {
          for (int r = 0; r < m; ++r) {
            int32_t a0;
            std::memcpy(&a0, qb + static_cast<size_t>(r) * k + p * 4, 4);
            acc[r] = _mm512_dpbusd_epi32(acc[r], packed, _mm512_set1_epi32(a0));
          }
        }
      }
      // one scale-and-add per (row, block): (sum q_w a - zero * sum a) * scale_w * scale_a
      const __m512 ws = _mm512_loadu_ps(w_scales + (static_cast<size_t>(g) * blocks + b) * 16);
      for (int r = 0; r < m; ++r) {
        const __m512i centred = _mm512_sub_epi32(acc[r], _mm512_set1_epi32(zero * a_sums[r * blocks + b]));
        out[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(centred), _mm512_mul_ps(ws, _mm512_set1_ps(a_scales[r * blocks + b])),
                                 out[r]);
      }
    }
    for (int r = 0; r < m; ++r) _mm512_storeu_ps(y + static_cast<size_t>(r) * n + g * 16, out[r]);
  }
}


using Part = void (*)(const uint8_t*, const float*, const int8_t*, const float*, const int32_t*, float*, int, int,
                      int, int);

// The compiled loop for m rows (1 <= m <= kMaxRows). A switch, not a static table: a function-local static of an
// inline function is one object for the whole process (a GNU unique symbol), so two builds of this kernel loaded in
// one process (a benchmark's baseline beside the build it measures) would both call the first one's loops.
template <int Bits>
inline Part part_for(int m) {
  switch (m) {
    case 1: return columns<1, Bits>;
    case 2: return columns<2, Bits>;
    case 3: return columns<3, Bits>;
    case 4: return columns<4, Bits>;
    case 5: return columns<5, Bits>;
    case 6: return columns<6, Bits>;
    case 7: return columns<7, Bits>;
    default: return columns<8, Bits>;
  }
}

// Columns [g0 * 16, g1 * 16) of Y for any number of rows, kMaxRows at a time (q, a_scales, a_sums as
// quantize_rows gives them): the weights of these columns stay in the cache from one pass to the next.
template <int Bits>
inline void all_rows(const uint8_t* w, const float* w_scales, const int8_t* q, const float* a_scales,
                     const int32_t* a_sums, float* y, int64_t m, int k, int n, int g0, int g1) {
  const int blocks = block_count(k);
  for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
    const int rows = static_cast<int>(m - r0 < kMaxRows ? m - r0 : kMaxRows);
    part_for<Bits>(rows)(w, w_scales, q + r0 * k, a_scales + r0 * blocks, a_sums + r0 * blocks, y + r0 * n, k, n, g0, g1);
  }
}

}  // namespace q4
