// phi-api's attention over int8 keys and values (AVX-512 VNNI), or float32 ones, for the decoder graph's
// GroupQueryAttention nodes: see attention_reference.py for what it computes. Flash-style: the queries of a task walk
// their row's keys 64 tokens at a time, with an online softmax; the int8 keys and values are widened to 16 bits in
// registers as they are multiplied, never dequantized to memory. What differs between the two caches is in the
// codecs Int8Cache and FloatCache; the walk, the softmax and the merges are shared.
//
// The int8 cache: one byte per value, one scale per (kv head, channel), in a layout of its own within each head's
// run of tokens (a multiple of 16 tokens long):
// - keys in tiles of 16 tokens: tile j holds tokens 16j..16j+15 as [D / 2][16 tokens][2 channels], so that 32 bytes
//   sign-extended to 16 bits are 2 channels of 16 tokens: a query's 2 channels (broadcast) times them is vpdpwssd's
//   16 dot products at once;
// - values in pairs of tokens: pair j holds tokens 2j, 2j+1 as [D][2], so that 32 bytes sign-extended are 16
//   channels of two tokens: a pair of probabilities (broadcast) times them is vpdpwssd's 16 sums at once.
// The float32 cache: keys in tiles of 16 tokens as [D][16 tokens] (a channel of 16 tokens is one vector: a query's
// channel, broadcast, times it is 16 fused multiply-adds), values token after token [D].
// A range of whole tiles (16 tokens) is a range of bytes: rows are copied, kept and stored on disk by such ranges.
//
// Queries are quantized per (token, head) to 16 bits, after the keys' per-channel scales and the softmax scale are
// folded in (the rounding's error in a score is at most a few percent of the one the int8 keys already make, in
// the root-mean-square: see docs/attention.md); probabilities to 15 bits per step of 64 tokens, the step's largest
// one as their scale. Scores, the softmax and the output accumulate in float32. Sums of
// int16 x int8 products stay within int32 up to D = 256.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace attn {

constexpr int kKeyTile = 16;      // tokens of a key tile (and the granule of a row's bytes)
constexpr int kQueryBlock = 8;    // queries (tokens x heads of a group) that share each tile they read
constexpr int kPartTiles = 32;    // a lone block of queries (a decode step) splits its keys into parts this long
constexpr int kMaxHeadSize = 256;

struct Layer {
  int heads, kv_heads, head_size;  // query heads, key/value heads, channels of a head
  int rot_half;                    // rotated channels / 2 (0: no rotary)
  bool interleaved;                // rotary on pairs (2i, 2i+1) rather than halves
  float scale;                     // the softmax scale
  int window;                      // > 0: a query sees the last `window` keys, its own included
};

template <typename T>  // int8_t (int8 or int4 keys and values) or float: the cache's element type
struct Step {
  const float* qkv;       // [rows, new, (heads + 2 kv_heads) * D]
  T* keys;                // [rows, kv_heads, tokens, width] in the codec's layout
  T* values;
  int64_t tokens;         // tokens a head's run of the cache holds (a multiple of kKeyTile)
  int width;              // elements a token takes in a head's run (the codec's token_width(D))
  const int32_t* lengths; // [rows]: tokens of each row once this step's are in
  const float* cos;       // [positions, rot_half]
  const float* sin;
  int64_t positions;
  const float* key_scale;    // [kv_heads, D] (int8; null for float32)
  const float* value_scale;  // [kv_heads, D] (int8; null for float32)
  float* out;             // [rows, new, heads * D]
  int rows, news;
};

inline int64_t key_offset(int64_t t, int d, int size) {
  return (t / kKeyTile) * kKeyTile * size + (d / 2) * 2 * kKeyTile + (t % kKeyTile) * 2 + (d % 2);
}

inline int64_t value_offset(int64_t t, int d, int size) { return (t / 2) * 2 * size + d * 2 + (t % 2); }

inline int64_t float_key_offset(int64_t t, int d, int size) {
  return (t / kKeyTile) * kKeyTile * size + d * kKeyTile + t % kKeyTile;
}

// Rotate one head's vector x (D channels) at the position whose cos/sin rows are given, into out.
inline void rotate(const float* x, const float* cos, const float* sin, const Layer& layer, float* out) {
  const int size = layer.head_size, half = layer.rot_half;
  std::memcpy(out, x, sizeof(float) * size);
  if (half == 0) return;
  if (layer.interleaved) {
    for (int i = 0; i < half; ++i) {
      const float even = x[2 * i], odd = x[2 * i + 1];
      out[2 * i] = even * cos[i] - odd * sin[i];
      out[2 * i + 1] = odd * cos[i] + even * sin[i];
    }
  } else {
    for (int i = 0; i < half; ++i) {
      const float first = x[i], second = x[i + half];
      out[i] = first * cos[i] - second * sin[i];
      out[i + half] = second * cos[i] + first * sin[i];
    }
  }
}

inline int8_t quantized(float x, float inverse) {  // ONNX Runtime's: rint(x * (1 / scale)), clamped
  return static_cast<int8_t>(std::clamp(std::nearbyint(x * inverse), -128.0f, 127.0f));
}

// The new keys and values of kv head h of row b (its `news` tokens) written into the cache, keys rotated first, by
// the codec's `write` (given the inverses of the channels' scales where it has them).
template <class C>
inline void write_head(const Step<typename C::Value>& step, const Layer& layer, int b, int h) {
  const int size = layer.head_size, width = (layer.heads + 2 * layer.kv_heads) * size;
  const int64_t length = step.lengths[b];
  typename C::Value* const keys = step.keys + (static_cast<int64_t>(b) * layer.kv_heads + h) * step.tokens * step.width;
  typename C::Value* const values = keys - step.keys + step.values;
  float rotated[kMaxHeadSize], kinverse[kMaxHeadSize], vinverse[kMaxHeadSize];
  if (step.key_scale) {
    for (int d = 0; d < size; ++d) {
      kinverse[d] = 1.0f / step.key_scale[h * size + d];
      vinverse[d] = 1.0f / step.value_scale[h * size + d];
    }
  }
  for (int s = 0; s < step.news; ++s) {
    const int64_t position = length - step.news + s;
    const float* token = step.qkv + (static_cast<int64_t>(b) * step.news + s) * width;
    const float* key = token + (layer.heads + h) * size;
    const float* value = token + (layer.heads + layer.kv_heads + h) * size;
    rotate(key, step.cos + position * layer.rot_half, step.sin + position * layer.rot_half, layer, rotated);
    C::write(keys, values, position, rotated, value, kinverse, vinverse, size);
  }
}

// exp(x) for x <= 0 (a probability's argument), to about 1e-7 relative; 0 below -87.
inline __m512 exp_negative(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);  // in [-0.5, 0.5]: 2^f by a polynomial
  __m512 p = _mm512_set1_ps(1.5353362e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3398874e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6180916e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503370e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022652e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314720e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// What one query holds while it walks its keys: the running max and sum of the softmax, and its output (not yet
// divided by the sum, nor times the values' scales for int8).
struct Running {
  float max, sum;
  alignas(64) float out[kMaxHeadSize];
};

inline void reset(Running& run, int size) {
  run.max = -INFINITY;
  run.sum = 0.0f;
  std::memset(run.out, 0, sizeof(float) * size);
}

// A step of the walk: up to kSpan tiles (64 tokens) for up to kTogether queries at once, their accumulators in
// registers: the scores of every (query, tile) pair are independent chains over the key channels (each load of
// keys serves all the queries), then one softmax update per query for the 64 tokens, then the values: (query, 16
// channels) accumulators over the tokens.
constexpr int kSpan = 4;       // tiles of one softmax update
constexpr int kTogether = 4;   // queries whose accumulators share the registers
constexpr int kLaneChunk = 4;  // 16-channel lanes of the values done at once

// One query's softmax update over a step's scores: its running max, sum and output's rescale, and the step's
// probabilities p; returns the largest of them (0: none seen, or all far below the keys before).
inline float softmax_step(const __m512 s[kSpan], Running& run, __m512 p[kSpan], float& rescale) {
  __m512 top4 = _mm512_max_ps(_mm512_max_ps(s[0], s[1]), _mm512_max_ps(s[2], s[3]));
  const float step_max = _mm512_reduce_max_ps(top4);
  rescale = 1.0f;
  if (step_max == -INFINITY) return 0.0f;
  const float top = std::max(run.max, step_max);
  rescale = run.max == -INFINITY ? 0.0f : std::exp(run.max - top);
  run.max = top;
  __m512 sum = _mm512_setzero_ps(), largest = _mm512_setzero_ps();
  for (int t = 0; t < kSpan; ++t) {
    // exp(-inf - top) is 0 (exp_negative clamps to -87, whose exp is the smallest normal: masked to 0 here)
    const __mmask16 seen = _mm512_cmp_ps_mask(s[t], _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    p[t] = _mm512_maskz_mov_ps(seen, exp_negative(_mm512_sub_ps(s[t], _mm512_set1_ps(top))));
    sum = _mm512_add_ps(sum, p[t]);
    largest = _mm512_max_ps(largest, p[t]);
  }
  run.sum = run.sum * rescale + _mm512_reduce_add_ps(sum);
  return _mm512_reduce_max_ps(largest);
}

// The scores of NQ queries against the `tiles` tiles of a step (tokens token0..), as the codec computed them (raw,
// before the query's scale), masked to what each query sees.
template <class Q, int NQ>
inline void masked(__m512 raw[NQ][kSpan], int tiles, int64_t token0, const Q* const* queries) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int t = 0; t < kSpan; ++t) {
    const __m512i token = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(token0 + t * kKeyTile)), lanes);
    for (int i = 0; i < NQ; ++i) {
      const __mmask16 seen =
          t >= tiles ? 0
                     : _mm512_cmp_epi32_mask(token, _mm512_set1_epi32(static_cast<int>(queries[i]->position)),
                                             _MM_CMPINT_LE) &
                           _mm512_cmp_epi32_mask(token, _mm512_set1_epi32(static_cast<int>(queries[i]->start)),
                                                 _MM_CMPINT_NLT);
      raw[i][t] = _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), seen, raw[i][t], _mm512_set1_ps(queries[i]->scale));
    }
  }
}

// The int8 cache. A query made ready for the keys: rotated, times the keys' channel scales and the softmax scale,
// quantized to 16 bits with its own scale (vpdpwssd's operand).
struct Int8Cache {
  using Value = int8_t;
  static constexpr bool kOwnExact = false;  // a query reads its own token's key and value from the cache too
  static constexpr bool kPairs = false;     // operands come one at a time (int4: two from one read, paired_*)
  static constexpr bool kExact = true;      // integer sums: their order does not change their bits
  static constexpr float kQueryUnits = 32767.0f;
  struct Query {
    alignas(64) int16_t units[kMaxHeadSize];
    float scale;
    int64_t position;  // the last key it reads from the cache: its token's (int4: the one before)
    int64_t start;     // the first key it sees
  };
  using Probabilities = int32_t[kSpan * kKeyTile / 2];  // 15-bit pairs: tokens 2j, 2j+1 in pairs[j]

  static int token_width(int size) { return size; }
  static void write(int8_t* keys, int8_t* values, int64_t position, const float* key, const float* value,
                    const float* kinverse, const float* vinverse, int size) {
    for (int d = 0; d < size; ++d) {
      keys[key_offset(position, d, size)] = quantized(key[d], kinverse[d]);
      values[value_offset(position, d, size)] = quantized(value[d], vinverse[d]);
    }
  }

  static void prepare(const float* x, const float* cos, const float* sin, const float* kscale, const Layer& layer,
                      Query& query) {
    float rotated[kMaxHeadSize];
    rotate(x, cos, sin, layer, rotated);
    float largest = 0.0f;
    for (int d = 0; d < layer.head_size; ++d) {
      rotated[d] *= kscale[d] * layer.scale;
      largest = std::max(largest, std::fabs(rotated[d]));
    }
    const float inverse = largest > 0.0f ? kQueryUnits / largest : 0.0f;
    for (int d = 0; d < layer.head_size; ++d)
      query.units[d] = static_cast<int16_t>(std::nearbyint(rotated[d] * inverse));
    query.scale = largest / kQueryUnits;
  }

  // The 16 tokens of tile t at channels 2c and 2c+1, widened to 16 bits: one vpdpwssd operand.
  static __m512i widened_keys(const int8_t* k, int t, int c, int size) {
    return _mm512_cvtepi8_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + t * kKeyTile * size + c * 32)));
  }

  // What the keys' walk (scores, below) needs: a pair of channels per vpdpwssd.
  static int key_steps(int size) { return size / 2; }
  static int32_t query_word(const Query& query, int c) { return reinterpret_cast<const int32_t*>(query.units)[c]; }
  static __m512i keys(const int8_t* k, int t, int c, int size) { return widened_keys(k, t, c, size); }
  // A score's chain as a float (int4 takes its keys' offset back here).
  static __m512 scored(__m512i acc, const Query&) { return _mm512_cvtepi32_ps(acc); }
  // The values' scale of channel d, applied once a query's walk is done (the outputs' finish).
  static float value_unit(const Step<int8_t>& step, int h, int size, int d) { return step.value_scale[h * size + d]; }
  // Scores as the keys' walk left them: one scale per channel, already in the query.
  template <int NQ>
  static void token_scores(__m512 (&)[NQ][kSpan], const int8_t*, int, int) {}

  // The step's probabilities as 15-bit pairs, the largest one as their unit; returns the unit (0: none).
  static float probabilities(const __m512 s[kSpan], Running& run, Probabilities& pairs, float& rescale,
                             const int8_t*, int, int) {
    __m512 p[kSpan];
    const float most = softmax_step(s, run, p, rescale);
    if (most == 0.0f) return 0.0f;  // every key here far below the ones before: nothing to add
    return units(p, most, pairs);
  }

  // Probabilities p as 15-bit pairs with `most` (their largest, > 0) as the unit; returns the unit.
  static float units(const __m512 p[kSpan], float most, Probabilities& pairs) {
    const __m512 to_units = _mm512_set1_ps(32767.0f / most);
    for (int t = 0; t < kSpan; ++t) {
      const __m256i words = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(p[t], to_units)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs + t * kKeyTile / 2), words);
    }
    return most / 32767.0f;
  }

  // What the values' weighing (weigh, below) needs: 32 bits of accumulators per channel, fed by pairs of tokens.
  using Acc = __m512i;
  static constexpr int kWeightsPerTile = kKeyTile / 2;  // a pair of probabilities per vpdpwssd
  static Acc zero() { return _mm512_setzero_si512(); }
  static Acc broadcast(int32_t pair) { return _mm512_set1_epi32(pair); }
  // Channels 16l..16l+15 of the pair of tokens j, widened to 16 bits.
  static Acc values(const int8_t* v, int j, int l, int size) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + j * 2 * size + l * 32)));
  }
  static Acc madd(Acc acc, Acc p, Acc value) { return _mm512_dpwssd_epi32(acc, p, value); }
  static __m512 to_float(Acc acc) { return _mm512_cvtepi32_ps(acc); }
  static Acc add(Acc a, Acc b) { return _mm512_add_epi32(a, b); }
  // A weighed sum of values as a float, less `offset` (int4's values' offset, weighed_offset; 0 here).
  static int32_t weighed_offset(const Probabilities&, int) { return 0; }
  static __m512 weighed(Acc acc, int32_t) { return _mm512_cvtepi32_ps(acc); }
};

// The float32 cache: queries rotated and times the softmax scale, in float32; products fused multiply-adds.
struct FloatCache {
  using Value = float;
  static constexpr bool kOwnExact = false;
  static constexpr bool kPairs = false;
  static constexpr bool kExact = false;  // float sums: summed in order, in one chain
  struct Query {
    alignas(64) float x[kMaxHeadSize];
    float scale;  // 1: the softmax scale is in x
    int64_t position;
    int64_t start;
  };
  using Probabilities = float[kSpan * kKeyTile];

  static int token_width(int size) { return size; }
  static void write(float* keys, float* values, int64_t position, const float* key, const float* value,
                    const float*, const float*, int size) {
    for (int d = 0; d < size; ++d) {
      keys[float_key_offset(position, d, size)] = key[d];
      values[position * size + d] = value[d];
    }
  }

  static void prepare(const float* x, const float* cos, const float* sin, const float*, const Layer& layer,
                      Query& query) {
    rotate(x, cos, sin, layer, query.x);
    for (int d = 0; d < layer.head_size; ++d) query.x[d] *= layer.scale;
    query.scale = 1.0f;
  }

  // What the keys' walk (scores, below) needs: a channel per fused multiply-add.
  static int key_steps(int size) { return size; }
  static float query_word(const Query& query, int d) { return query.x[d]; }
  static __m512 keys(const float* k, int t, int d, int size) {
    return _mm512_loadu_ps(k + t * kKeyTile * size + d * kKeyTile);
  }
  static __m512 scored(__m512 acc, const Query&) { return acc; }
  static float value_unit(const Step<float>&, int, int, int) { return 1.0f; }
  template <int NQ>
  static void token_scores(__m512 (&)[NQ][kSpan], const float*, int, int) {}

  // The step's probabilities as they are; returns 1 (0: none).
  static float probabilities(const __m512 s[kSpan], Running& run, Probabilities& probs, float& rescale,
                             const float*, int, int) {
    __m512 p[kSpan];
    if (softmax_step(s, run, p, rescale) == 0.0f) return 0.0f;
    for (int t = 0; t < kSpan; ++t) _mm512_storeu_ps(probs + t * kKeyTile, p[t]);
    return 1.0f;
  }

  using Acc = __m512;
  static constexpr int kWeightsPerTile = kKeyTile;
  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc broadcast(float p) { return _mm512_set1_ps(p); }
  static Acc values(const float* v, int j, int l, int size) { return _mm512_loadu_ps(v + j * size + l * 16); }
  static Acc madd(Acc acc, Acc p, Acc value) { return _mm512_fmadd_ps(p, value, acc); }
  static __m512 to_float(Acc acc) { return acc; }
  static int32_t weighed_offset(const Probabilities&, int) { return 0; }
  static __m512 weighed(Acc acc, int32_t) { return acc; }
};

// The raw scores of NQ queries against the `tiles` tiles of a step: NQ x 4 independent chains in registers, each
// summing its channels in order (a query's bits do not depend on the queries or tiles beside it). Fewer queries than
// a full group (a decode step's, whose keys come from memory once): tile by tile, in the order the keys lie in memory
// (walked across the tiles, the reads of a step's 4 tiles interleave and the step waits on memory: one int8 layer at
// Phi-3.5's shape, `bench attention --baseline`, 8 rows at 4,096 keys 0.65x the time tile by tile, one row 0.91x; a
// prompt chunk's blocks read their keys from cache, where the order below is no slower); a full group: each
// channel's broadcasts serve the step's tiles. Every chain sums the same products in the same order either way.
template <class C, int NQ>
inline void paired_scores(const typename C::Value* k, int tiles, const typename C::Query* const* queries, int size,
                          __m512 out[NQ][kSpan]);

template <class C, int NQ>
inline void scores(const typename C::Value* k, int tiles, const typename C::Query* const* queries, int size,
                   __m512 out[NQ][kSpan]) {
  if constexpr (C::kPairs) {
    paired_scores<C, NQ>(k, tiles, queries, size, out);
    return;
  }
  typename C::Acc acc[NQ][kSpan];
  for (int i = 0; i < NQ; ++i)
    for (int t = 0; t < kSpan; ++t) acc[i][t] = C::zero();
  const int steps = C::key_steps(size);
  if constexpr (NQ < kTogether) {
    // Tile by tile. Integer sums (kExact) go in two chains, even and odd steps, added at the end (the same bits in
    // any order): a lone query's tile is otherwise one chain of dependent multiply-adds as long as the head. Float
    // sums go in one chain, in order.
    constexpr int kChains = C::kExact ? 2 : 1;
    for (int t = 0; t < kSpan; ++t) {  // kSpan, not tiles: unrolled, the accumulators stay in registers
      if (t >= tiles) break;
      typename C::Acc odd[NQ];
      for (int i = 0; i < NQ; ++i) odd[i] = C::zero();
      for (int c = 0; c < steps; c += kChains) {
        const typename C::Acc key = C::keys(k, t, c, size);
        for (int i = 0; i < NQ; ++i) acc[i][t] = C::madd(acc[i][t], C::broadcast(C::query_word(*queries[i], c)), key);
        if constexpr (kChains == 2) {
          const typename C::Acc next = C::keys(k, t, c + 1, size);
          for (int i = 0; i < NQ; ++i) odd[i] = C::madd(odd[i], C::broadcast(C::query_word(*queries[i], c + 1)), next);
        }
      }
      if constexpr (kChains == 2)
        for (int i = 0; i < NQ; ++i) acc[i][t] = C::add(acc[i][t], odd[i]);
    }
  } else {
    for (int c = 0; c < steps; ++c) {
      typename C::Acc q[NQ];
      for (int i = 0; i < NQ; ++i) q[i] = C::broadcast(C::query_word(*queries[i], c));
      for (int t = 0; t < kSpan; ++t) {
        if (t >= tiles) break;
        const typename C::Acc key = C::keys(k, t, c, size);
        for (int i = 0; i < NQ; ++i) acc[i][t] = C::madd(acc[i][t], q[i], key);
      }
    }
  }
  for (int i = 0; i < NQ; ++i)
    for (int t = 0; t < kSpan; ++t) out[i][t] = C::scored(acc[i][t], *queries[i]);
}

// scores for a codec whose one read gives two operands (int4: channel pairs 2cc and 2cc+1). For one or two queries
// each (query, tile) sums them in two chains, even and odd pairs, added at the end (half the chain's length: a
// lone query's tile is otherwise one long chain of dependent multiply-adds); for more, in one chain (twice the
// accumulators would no longer fit the registers).
template <class C, int NQ>
inline void paired_scores(const typename C::Value* k, int tiles, const typename C::Query* const* queries, int size,
                          __m512 out[NQ][kSpan]) {
  constexpr bool kSplit = NQ <= 2;
  typename C::Acc even[NQ][kSpan], odd[NQ][kSpan];
  for (int i = 0; i < NQ; ++i)
    for (int t = 0; t < kSpan; ++t) even[i][t] = odd[i][t] = C::zero();
  const int pairs = C::key_steps(size) / 2;
  auto add = [&](int i, int t, typename C::Acc q0, typename C::Acc q1, typename C::Acc low, typename C::Acc high) {
    even[i][t] = C::madd(even[i][t], q0, low);
    if constexpr (kSplit) {
      odd[i][t] = C::madd(odd[i][t], q1, high);
    } else {
      even[i][t] = C::madd(even[i][t], q1, high);
    }
  };
  if constexpr (NQ < kTogether) {  // tile by tile, as scores walks them
    for (int t = 0; t < kSpan; ++t) {
      if (t >= tiles) break;
      for (int cc = 0; cc < pairs; ++cc) {
        typename C::Acc low, high;
        C::key_pair(k, t, cc, size, low, high);
        for (int i = 0; i < NQ; ++i)
          add(i, t, C::broadcast(C::query_word(*queries[i], 2 * cc)),
              C::broadcast(C::query_word(*queries[i], 2 * cc + 1)), low, high);
      }
    }
  } else {  // a full group: each pair's broadcasts serve the step's tiles
    for (int cc = 0; cc < pairs; ++cc) {
      typename C::Acc q0[NQ], q1[NQ];
      for (int i = 0; i < NQ; ++i) {
        q0[i] = C::broadcast(C::query_word(*queries[i], 2 * cc));
        q1[i] = C::broadcast(C::query_word(*queries[i], 2 * cc + 1));
      }
      for (int t = 0; t < kSpan; ++t) {
        if (t >= tiles) break;
        typename C::Acc low, high;
        C::key_pair(k, t, cc, size, low, high);
        for (int i = 0; i < NQ; ++i) add(i, t, q0[i], q1[i], low, high);
      }
    }
  }
  for (int i = 0; i < NQ; ++i)
    for (int t = 0; t < kSpan; ++t)
      out[i][t] = C::scored(kSplit ? C::add(even[i][t], odd[i][t]) : even[i][t], *queries[i]);
}

// The values of a step (the `tiles` tiles at v) weighted by NQ queries' probabilities (in the codec's units), into
// their outputs: (query, 16 channels) accumulators over the step's tokens.
template <class C, int NQ>
inline void weigh(const typename C::Value* v, int tiles, const typename C::Probabilities probs[NQ], const float* unit,
                  const float* rescale, Running* const* runs, int size) {
  const int lanes = size / 16, count = tiles * C::kWeightsPerTile;
  int32_t offset[NQ];
  for (int i = 0; i < NQ; ++i) offset[i] = C::weighed_offset(probs[i], count);
  for (int l0 = 0; l0 < lanes; l0 += kLaneChunk) {
    typename C::Acc acc[NQ][kLaneChunk];
    for (int i = 0; i < NQ; ++i)
      for (int l = 0; l < kLaneChunk; ++l) acc[i][l] = C::zero();
    for (int j = 0; j < count; ++j) {
      typename C::Acc p[NQ];
      for (int i = 0; i < NQ; ++i) p[i] = C::broadcast(probs[i][j]);
      if constexpr (C::kPairs && NQ <= 2) {  // lanes l, l+1 from one read (D a multiple of 32): for few queries
        // (more, and the accumulators with both operands no longer fit the registers: measured slower)
        for (int l = 0; l < kLaneChunk; l += 2) {
          if (l0 + l >= lanes) break;
          typename C::Acc low, high;
          C::value_pair(v, j, l0 + l, size, low, high);
          for (int i = 0; i < NQ; ++i) {
            acc[i][l] = C::madd(acc[i][l], p[i], low);
            acc[i][l + 1] = C::madd(acc[i][l + 1], p[i], high);
          }
        }
        continue;
      }
      for (int l = 0; l < kLaneChunk; ++l) {
        if (l0 + l >= lanes) break;
        const typename C::Acc value = C::values(v, j, l0 + l, size);
        for (int i = 0; i < NQ; ++i) acc[i][l] = C::madd(acc[i][l], p[i], value);
      }
    }
    for (int i = 0; i < NQ; ++i) {
      const __m512 u = _mm512_set1_ps(unit[i]), keep = _mm512_set1_ps(rescale[i]);
      for (int l = 0; l < kLaneChunk; ++l) {
        if (l0 + l >= lanes) break;
        float* out = runs[i]->out + (l0 + l) * 16;
        _mm512_store_ps(out, _mm512_fmadd_ps(C::weighed(acc[i][l], offset[i]), u,
                                             _mm512_mul_ps(_mm512_load_ps(out), keep)));
      }
    }
  }
}

// NQ queries over the tiles [first_tile, end_tile) of one row's kv head, a step of kSpan tiles at a time.
template <class C, int NQ>
inline void walk(const typename C::Value* keys, const typename C::Value* values,
                 const typename C::Query* const* queries, Running* const* runs, int size, int64_t first_tile,
                 int64_t end_tile) {
  // No software prefetch: measured, it slowed the walk (the hardware's prefetchers follow these two streams)
  const int64_t tile_values = static_cast<int64_t>(kKeyTile) * C::token_width(size);
  int64_t seen_first = queries[0]->start, seen_last = queries[0]->position;
  for (int i = 1; i < NQ; ++i) {
    seen_first = std::min(seen_first, queries[i]->start);
    seen_last = std::max(seen_last, queries[i]->position);
  }
  // Steps on the absolute grid of kSpan tiles (tiles before a query's window are masked out): which tiles a step
  // holds then depends on the keys' positions only, not on the other queries walking beside it.
  first_tile = std::max(first_tile, seen_first / kKeyTile / kSpan * kSpan);
  end_tile = std::min(end_tile, seen_last / kKeyTile + 1);
  for (int64_t t = first_tile; t < end_tile; t += kSpan) {
    const int tiles = static_cast<int>(std::min<int64_t>(kSpan, end_tile - t));
    __m512 s[NQ][kSpan];
    scores<C, NQ>(keys + t * tile_values, tiles, queries, size, s);
    C::template token_scores<NQ>(s, keys + t * tile_values, tiles, size);
    masked<typename C::Query, NQ>(s, tiles, t * kKeyTile, queries);
    alignas(64) typename C::Probabilities probs[NQ];
    float unit[NQ], rescale[NQ];
    bool any = false;
    for (int i = 0; i < NQ; ++i) {
      unit[i] = C::probabilities(s[i], *runs[i], probs[i], rescale[i], values + t * tile_values, tiles, size);
      if (unit[i] == 0.0f) {
        std::memset(probs[i], 0, sizeof(probs[i]));
      } else {
        any = true;
      }
    }
    if (any) weigh<C, NQ>(values + t * tile_values, tiles, probs, unit, rescale, runs, size);
    // a query that saw nothing of this step still had its output rescaled (by 1) above: nothing else to do
  }
}

// The queries of one task (up to kQueryBlock: tokens x heads of one kv head's group) over the tiles
// [first_tile, end_tile) of one row's kv head; each query's Running carries on from where it stood.
template <class C>
inline void attend(const typename C::Value* keys, const typename C::Value* values, const typename C::Query* queries,
                   int count, int size, int64_t first_tile, int64_t end_tile, Running* running) {
  for (int first = 0; first < count; first += kTogether) {
    const typename C::Query* group[kTogether];
    Running* runs[kTogether];
    const int n = std::min(kTogether, count - first);
    for (int i = 0; i < n; ++i) {
      group[i] = &queries[first + i];
      runs[i] = &running[first + i];
    }
    switch (n) {
      case 1: walk<C, 1>(keys, values, group, runs, size, first_tile, end_tile); break;
      case 2: walk<C, 2>(keys, values, group, runs, size, first_tile, end_tile); break;
      case 3: walk<C, 3>(keys, values, group, runs, size, first_tile, end_tile); break;
      default: walk<C, 4>(keys, values, group, runs, size, first_tile, end_tile); break;
    }
  }
}

// Two walks over disjoint keys made one (the flash-decoding merge): into `into`, from `from`.
inline void merge(Running& into, const Running& from, int size) {
  if (from.max == -INFINITY) return;
  const float top = std::max(into.max, from.max);
  const float a = into.max == -INFINITY ? 0.0f : std::exp(into.max - top), b = std::exp(from.max - top);
  for (int d = 0; d < size; ++d) into.out[d] = into.out[d] * a + from.out[d] * b;
  into.sum = into.sum * a + from.sum * b;
  into.max = top;
}

// The part of the absolute grid of kPartTiles that holds tile t ends before this tile.
inline int64_t part_end(int64_t t) { return (t / kPartTiles + 1) * kPartTiles; }

// The queries over the tiles [first_tile, end_tile) part by part on the absolute grid of kPartTiles, each part's walk
// merged into their running state in order: the arithmetic of a lone block whose parts are tasks of their own
// (attend, then merge), so that a query's bits are those of a one-token step whatever else its step holds.
template <class C>
inline void attend_parts(const typename C::Value* keys, const typename C::Value* values,
                         const typename C::Query* queries, int count, int size, int64_t first_tile, int64_t end_tile,
                         Running* running) {
  alignas(64) Running part[kQueryBlock];
  for (int64_t from = first_tile; from < end_tile; from = part_end(from)) {
    const int64_t to = std::min(end_tile, part_end(from));
    if (from == first_tile) {
      attend<C>(keys, values, queries, count, size, from, to, running);
      continue;
    }
    for (int i = 0; i < count; ++i) reset(part[i], size);
    attend<C>(keys, values, queries, count, size, from, to, part);
    for (int i = 0; i < count; ++i) merge(running[i], part[i], size);
  }
}

}  // namespace attn
