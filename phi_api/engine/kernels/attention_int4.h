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
// for the other caches), in groups of the 32 values the int8 layout puts in one vpdpwssd operand:
// - keys: group c is the pair of channels 2c, 2c+1 of the tile's 16 tokens ([16 tokens][2 channels]);
// - values: group j * D / 16 + l is the pair of tokens 2j, 2j+1 at the 16 channels 16l.. ([16 channels][2 tokens]);
// groups 2g and 2g+1 share 32 bytes, value i of the first in the low nibble of byte i, of the second in the high
// one (so D is a multiple of 32); then the 16 tokens' scales (float32). A group is unpacked in registers by a mask
// (and a shift, for the high one) and a widening: the int8 codec's operand, the nibbles plus 8. The 8 is taken back
// once per score and weighed sum (from the query's units' sum, and from the probabilities' sum), not per value.
#pragma once

#include "attention_kernel.h"

namespace attn {

struct Int4Cache : Int8Cache {
  static constexpr bool kOwnExact = true;
  static constexpr bool kPairs = true;
  static constexpr bool kExact = true;  // integer sums
  struct Query : Int8Cache::Query {
    int32_t offset;  // 8 times the sum of its units: what the nibbles' +8 adds to a score's chain
  };

  static void prepare(const float* x, const float* cos, const float* sin, const float* kscale, const Layer& layer,
                      Query& query) {
    Int8Cache::prepare(x, cos, sin, kscale, layer, query);
    int32_t sum = 0;
    for (int d = 0; d < layer.head_size; ++d) sum += query.units[d];
    query.offset = 8 * sum;
  }

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
      const int index = nibble(d), byte = index % 32 + (index / 64) * 32, high = (index / 32) % 2;
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

  // The two groups of the 32 bytes at p (low nibbles, high nibbles) as 32 int16 words each, each its value + 8:
  // one read and one widening for both.
  static void unpacked(const int8_t* p, __m512i& low, __m512i& high) {
    const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    low = _mm512_and_si512(bytes, _mm512_set1_epi16(0x0F));
    high = _mm512_srli_epi16(bytes, 4);
  }

  // Key groups 2 cc and 2 cc + 1 (channels 4 cc .. 4 cc + 3) of tile t.
  static void key_pair(const int8_t* k, int t, int cc, int size, __m512i& low, __m512i& high) {
    unpacked(k + t * tile_bytes(size) + cc * 32, low, high);
  }
  // Value lane l of the pair of tokens j alone (for many queries: the accumulators take the registers).
  static Acc values(const int8_t* v, int j, int l, int size) {
    const int group = (j % kWeightsPerTile) * (size / 16) + l;
    const int8_t* p = v + (j / kWeightsPerTile) * tile_bytes(size) + (group / 2) * 32;
    __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if (group % 2) x = _mm256_srli_epi16(x, 4);
    return _mm512_cvtepu8_epi16(_mm256_and_si256(x, _mm256_set1_epi8(0x0F)));
  }
  // Value lanes l, l + 1 (l even) of the pair of tokens j.
  static void value_pair(const int8_t* v, int j, int l, int size, __m512i& low, __m512i& high) {
    unpacked(v + (j / kWeightsPerTile) * tile_bytes(size) + ((j % kWeightsPerTile) * (size / 16) + l) * 16, low,
             high);
  }
  static __m512 scored(__m512i acc, const Query& query) {
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(query.offset)));
  }
  // 8 times the sum of a step's probabilities (`count` pairs of 15-bit units): what the nibbles' +8 adds to each
  // weighed sum.
  static int32_t weighed_offset(const Probabilities& pairs, int count) {
    int32_t sum = 0;
    for (int j = 0; j < count; ++j) sum += (pairs[j] & 0xFFFF) + (pairs[j] >> 16);
    return 8 * sum;
  }
  static __m512 weighed(Acc acc, int32_t offset) {
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(offset)));
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
