// The int4 cache of phi-api's attention (attention_kernel.h's walk; see attention_reference.py for what it
// computes): half the bytes of the int8 cache, for twice the tokens in the same memory.
//
// A value x of a token's key (after the rotary embedding) or value is first divided by its channel's scale (the int8
// cache's, calibrated per kv head and channel: the channels come to one range, so that a few large ones do not
// drown the rest), then the token's vector in a head is rounded to 4 bits with a scale of its own, its largest
// magnitude over 7: q = clamp(rint(x' * (7 / m)), -7, 7), stored as q + 8 in a nibble, and its scale m / 7 beside.
// A score is then the token's scale times the int4 keys' dot product with the query (which holds the channels'
// scales, as for int8); a value's token scale joins its probability before the probabilities are rounded to 15 bits.
// A query's own token is the one exception: its key and value are taken as the step computed them, in float32 (the
// cache holds them in 4 bits for the tokens after). Read back in 4 bits, they cost the default model a third of its
// top-1 agreement with float32 (`bench kv`); exact, they cost what an earlier token's rounding does. A check's tokens
// still get the bits of one-token steps: each sees the tokens before it from the cache, and itself exactly.
//
// The layout, per run of 16 tokens (a tile, 16 * (D / 2 + 4) bytes: a range of whole tiles is a range of bytes, as
// for the other caches):
// - keys: for each pair of channels c, 16 bytes holding the 32 values the int8 tile holds for it ([16 tokens][2
//   channels]): value i in the low nibble of byte i, value 16 + i in its high one; then the 16 tokens' scales
//   (float32). Unpacked in registers to the int8 tile's 32 words: the same vpdpwssd as int8 keys.
// - values: for each pair of tokens j and 16 channels l, 16 bytes holding the int8 layout's 32 values ([16
//   channels][2 tokens]) the same way; then the 16 tokens' scales.
#pragma once

#include "attention_kernel.h"

namespace attn {

struct Int4Cache : Int8Cache {
  static constexpr bool kOwnExact = true;

  // Elements (bytes) a token takes in a head's run: D / 2 of nibbles and 4 of its scale.
  static int token_width(int size) { return size / 2 + 4; }
  static int64_t tile_bytes(int size) { return static_cast<int64_t>(kKeyTile) * token_width(size); }
  static const float* token_scales(const int8_t* tile, int size) {
    return reinterpret_cast<const float*>(tile + 8 * size);
  }

  // A token's vector (D channels), times the channels' inverse scales, in 4 bits with its own scale: the nibbles
  // (q + 8) into `nibble(d)`'s places, the scale returned.
  template <class Place>
  static float pack(const float* x, const float* inverse, int size, int8_t* tile, Place nibble) {
    float normal[kMaxHeadSize], largest = 0.0f;
    for (int d = 0; d < size; ++d) {
      normal[d] = x[d] * inverse[d];
      largest = std::max(largest, std::fabs(normal[d]));
    }
    const float to_units = largest > 0.0f ? 7.0f / largest : 0.0f;
    for (int d = 0; d < size; ++d) {
      const int q = static_cast<int>(std::clamp(std::nearbyint(normal[d] * to_units), -7.0f, 7.0f)) + 8;
      const int index = nibble(d), byte = index % 16 + (index / 32) * 16, high = (index / 16) % 2;
      uint8_t& place = reinterpret_cast<uint8_t*>(tile)[byte];
      place = static_cast<uint8_t>(high ? (place & 0x0F) | (q << 4) : (place & 0xF0) | q);
    }
    return largest / 7.0f;
  }

  // A query's own token (its rotated key and its value, float32), exact, into its running state: one more key of
  // the online softmax. `query`: the query rotated, times the softmax scale; `vscale`: the values' channel scales
  // (the running output is in their units until the finish).
  static void own(const float* query, const float* key, const float* value, const float* vscale, int size,
                  Running& run) {
    float score = 0.0f;
    for (int d = 0; d < size; ++d) score += query[d] * key[d];
    const float top = std::max(run.max, score);
    const float keep = run.max == -INFINITY ? 0.0f : std::exp(run.max - top), weight = std::exp(score - top);
    for (int d = 0; d < size; ++d) run.out[d] = run.out[d] * keep + weight * value[d] / vscale[d];
    run.sum = run.sum * keep + weight;
    run.max = top;
  }

  // The token at `position` written into its tile of keys and of values.
  static void write(int8_t* keys, int8_t* values, int64_t position, const float* key, const float* value,
                    const float* kinverse, const float* vinverse, int size) {
    const int64_t tile = position / kKeyTile * tile_bytes(size);
    const int t = static_cast<int>(position % kKeyTile);
    // keys: pair of channels c's 32 values ([16 tokens][2 channels]) at 32 * c; values: pair of tokens j's 16
    // channels l ([16 channels][2 tokens]) at 32 * (j * D / 16 + l)
    const float kscale = pack(key, kinverse, size, keys + tile, [t](int d) { return 32 * (d / 2) + t * 2 + d % 2; });
    const float vscale = pack(value, vinverse, size, values + tile, [t, size](int d) {
      return 32 * ((t / 2) * (size / 16) + d / 16) + (d % 16) * 2 + t % 2;
    });
    std::memcpy(keys + tile + 8 * size + 4 * t, &kscale, sizeof(float));
    std::memcpy(values + tile + 8 * size + 4 * t, &vscale, sizeof(float));
  }

  // 16 bytes of nibbles as the 32 int16 words they hold (the int8 layout's 32 values).
  static __m512i unpacked(const int8_t* p) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), low = _mm_set1_epi8(0x0F);
    const __m256i bytes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), low), _mm_and_si128(x, low));
    return _mm512_sub_epi16(_mm512_cvtepu8_epi16(bytes), _mm512_set1_epi16(8));
  }

  static __m512i keys(const int8_t* k, int t, int c, int size) { return unpacked(k + t * tile_bytes(size) + c * 16); }
  static Acc values(const int8_t* v, int j, int l, int size) {
    return unpacked(v + (j / kWeightsPerTile) * tile_bytes(size) + ((j % kWeightsPerTile) * (size / 16) + l) * 16);
  }

  // The scores of the step's tiles times each token's key scale (a tile's unseen tokens are masked after).
  template <int NQ>
  static void token_scores(__m512 (&s)[NQ][kSpan], const int8_t* k, int tiles, int size) {
    for (int t = 0; t < tiles; ++t) {
      const __m512 scale = _mm512_loadu_ps(token_scales(k + t * tile_bytes(size), size));
      for (int i = 0; i < NQ; ++i) s[i][t] = _mm512_mul_ps(s[i][t], scale);
    }
  }

  // The step's probabilities times each token's value scale, as 15-bit pairs with the largest as their unit;
  // returns the unit (0: no key of the step counts).
  static float probabilities(const __m512 s[kSpan], Running& run, Probabilities& pairs, float& rescale,
                             const int8_t* v, int tiles, int size) {
    __m512 p[kSpan];
    if (softmax_step(s, run, p, rescale) == 0.0f) return 0.0f;
    __m512 largest = _mm512_setzero_ps();
    for (int t = 0; t < kSpan; ++t) {
      // an unseen token's probability is 0, and its scale whatever the memory held: kept out
      const __mmask16 seen = t < tiles ? _mm512_cmp_ps_mask(p[t], _mm512_setzero_ps(), _CMP_NEQ_OQ) : 0;
      p[t] = _mm512_maskz_mul_ps(seen, p[t], _mm512_maskz_loadu_ps(seen, token_scales(v + t * tile_bytes(size),
                                                                                     size)));
      largest = _mm512_max_ps(largest, p[t]);
    }
    const float most = _mm512_reduce_max_ps(largest);
    if (most > 0.0f) return units(p, most, pairs);
    std::memset(pairs, 0, sizeof(Probabilities));  // values of scale 0: nothing to add, but the rescale stands
    return 1.0f;
  }
};

}  // namespace attn
