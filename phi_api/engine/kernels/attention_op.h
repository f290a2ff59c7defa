// ONNX Runtime's custom operators phi_api.Attention (int8 keys and values), phi_api.Attention4 (int4 ones with a
// scale per token: attention_int4.h) and phi_api.AttentionFloat (float32 ones): attention_kernel.h in the decoder
// graph, in place of GroupQueryAttention (see attention.py for when). Their inputs are GroupQueryAttention's: the
// packed query, key and value [B, S, (N + 2 Nkv) D] (0), the past keys and values (3, 4: [B, Nkv, L, the codec's
// token width] in the kernel's layout, bound as the present ones too), seqlens_k (5: each row's length once the
// step's tokens are in, minus one), total_sequence_length (6), the rotary tables (7, 8) and, for int8 and int4, the
// keys' and values' scales per kv head and channel (12, 13); inputs 1, 2, 9, 10, 11 are absent. Unlike
// GroupQueryAttention, S new tokens may come for each of B > 1 rows of different lengths. Outputs: the attention
// [B, S, N D], and the present keys and values (the past's buffers, written in place; copied first if ONNX Runtime
// gave other buffers).
//
// A step first writes every row's new keys and values (a task per row and kv head), then attends: a task per (row,
// kv head, block of the group's queries, and for a lone block part of the keys), shared among ONNX Runtime's
// intra-op threads, then merges the parts. A row's numbers come from its own tasks only, split by its own length:
// they do not depend on the other rows of the step, nor on the threads.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "attention_int4.h"
#include "attention_kernel.h"

namespace attn_op {

// One task: the queries of block `block` of (row b, kv head h) over the tiles [first_tile, end_tile) of their keys.
// Keys are walked in parts on the absolute grid of kPartTiles, merged in order: a lone block (a row's step has at
// most kQueryBlock queries per kv head: a decode step, a short draft) makes each part a task whose result waits in
// `partial` for the merge; a task of several blocks walks the parts in turn. Either way a query's arithmetic
// depends on its own position alone: its bits never depend on the other rows of the step, nor on the other tokens
// of its own row's step (a draft's check gives each token what one-token steps give it).
struct Task {
  int b, h, block, parts;
  int64_t first_tile, end_tile;
  int64_t partial;  // index of this task's results in the scratch (-1: written straight to the output)
};

template <class C>
struct Work {
  const attn::Step<typename C::Value>* step;
  const attn::Layer* layer;
  int blocks;  // query blocks per (row, kv head)
  std::vector<Task> tasks;
  std::vector<int> merges;     // the first task of each split block
  std::unique_ptr<attn::Running[]> partial;  // not initialized: each task resets its own
};

template <class C>
inline void write_task(void* data, size_t index) {
  const Work<C>& work = *static_cast<const Work<C>*>(data);
  const int h = static_cast<int>(index % work.layer->kv_heads), b = static_cast<int>(index / work.layer->kv_heads);
  attn::write_head<C>(*work.step, *work.layer, b, h);
}

// The queries of a block: how many, and query i's token s and head.
template <class C>
inline int block_queries(const Work<C>& work, int block) {
  const int total = work.step->news * (work.layer->heads / work.layer->kv_heads);
  return std::min(attn::kQueryBlock, total - block * attn::kQueryBlock);
}

template <class C>
inline void query_place(const Work<C>& work, int h, int block, int i, int& s, int& head) {
  const int group = work.layer->heads / work.layer->kv_heads, n = block * attn::kQueryBlock + i;
  s = n / group;
  head = h * group + n % group;
}

// Where the codec takes a query's own token exactly (int4), that token into the running states of a block's queries,
// once every part of their keys is in (so the same arithmetic whether the keys were walked in one task or several).
template <class C>
inline void own_tokens(const Work<C>& work, int b, int h, int block, attn::Running* running) {
  if constexpr (C::kOwnExact) {
    const attn::Step<typename C::Value>& step = *work.step;
    const attn::Layer& layer = *work.layer;
    const int size = layer.head_size, width = (layer.heads + 2 * layer.kv_heads) * size;
    alignas(64) float query[attn::kMaxHeadSize], key[attn::kMaxHeadSize];
    for (int i = 0; i < block_queries(work, block); ++i) {
      int s, head;
      query_place(work, h, block, i, s, head);
      const int64_t position = step.lengths[b] - step.news + s;
      const float* token = step.qkv + (static_cast<int64_t>(b) * step.news + s) * width;
      const float *cos = step.cos + position * layer.rot_half, *sin = step.sin + position * layer.rot_half;
      attn::rotate(token + head * size, cos, sin, layer, query);
      for (int d = 0; d < size; ++d) query[d] *= layer.scale;
      attn::rotate(token + (layer.heads + h) * size, cos, sin, layer, key);
      C::own(query, key, token + (layer.heads + layer.kv_heads + h) * size, step.value_scale + h * size, size,
             running[i]);
    }
  }
}

template <class C>
inline void finish(const Work<C>& work, int b, int h, int block, const attn::Running* running) {
  const attn::Step<typename C::Value>& step = *work.step;
  const int size = work.layer->head_size, count = block_queries(work, block);
  for (int i = 0; i < count; ++i) {
    int s, head;
    query_place(work, h, block, i, s, head);
    float* out = step.out + ((static_cast<int64_t>(b) * step.news + s) * work.layer->heads + head) * size;
    const float inverse = running[i].sum > 0.0f ? 1.0f / running[i].sum : 0.0f;
    for (int d = 0; d < size; ++d) out[d] = running[i].out[d] * C::value_unit(step, h, size, d) * inverse;
  }
}

template <class C>
inline void attend_task(void* data, size_t index) {
  Work<C>& work = *static_cast<Work<C>*>(data);
  const Task& task = work.tasks[index];
  const attn::Step<typename C::Value>& step = *work.step;
  const attn::Layer& layer = *work.layer;
  const int size = layer.head_size, width = (layer.heads + 2 * layer.kv_heads) * size;
  const int count = block_queries(work, task.block);
  const int64_t length = step.lengths[task.b];
  alignas(64) typename C::Query queries[attn::kQueryBlock];
  alignas(64) attn::Running local[attn::kQueryBlock];
  attn::Running* running = task.partial < 0 ? local : &work.partial[task.partial];
  for (int i = 0; i < count; ++i) {
    int s, head;
    query_place(work, task.h, task.block, i, s, head);
    const int64_t position = length - step.news + s;
    const float* x = step.qkv + (static_cast<int64_t>(task.b) * step.news + s) * width + head * size;
    C::prepare(x, step.cos + position * layer.rot_half, step.sin + position * layer.rot_half,
               step.key_scale ? step.key_scale + task.h * size : nullptr, layer, queries[i]);
    queries[i].position = position - (C::kOwnExact ? 1 : 0);  // its own token apart (own_tokens)
    queries[i].start = layer.window > 0 ? std::max<int64_t>(0, position + 1 - layer.window) : 0;
    attn::reset(running[i], size);
  }
  const int64_t base = (static_cast<int64_t>(task.b) * layer.kv_heads + task.h) * step.tokens * step.width;
  if (task.partial < 0) {  // all its keys in this task: part by part, merged in order, as split blocks are
    attn::attend_parts<C>(step.keys + base, step.values + base, queries, count, size, task.first_tile,
                          task.end_tile, running);
    own_tokens(work, task.b, task.h, task.block, running);
    finish(work, task.b, task.h, task.block, running);
  } else {  // one part of a split block's keys
    attn::attend<C>(step.keys + base, step.values + base, queries, count, size, task.first_tile, task.end_tile,
                    running);
  }
}

template <class C>
inline void merge_task(void* data, size_t index) {
  Work<C>& work = *static_cast<Work<C>*>(data);
  const int first = work.merges[index];
  const Task& task = work.tasks[first];
  const int count = block_queries(work, task.block), size = work.layer->head_size;
  attn::Running* into = &work.partial[task.partial];
  for (int part = 1; part < task.parts; ++part)
    for (int i = 0; i < count; ++i) attn::merge(into[i], work.partial[work.tasks[first + part].partial + i], size);
  own_tokens(work, task.b, task.h, task.block, into);
  finish(work, task.b, task.h, task.block, into);
}

// The tasks of a step: per row, kv head and block of queries, the tiles its queries see, split in parts for a
// lone block.
template <class C>
inline void plan(Work<C>& work) {
  const attn::Step<typename C::Value>& step = *work.step;
  const attn::Layer& layer = *work.layer;
  int64_t scratch = 0;
  for (int b = 0; b < step.rows; ++b) {
    const int64_t length = step.lengths[b];
    for (int h = 0; h < layer.kv_heads; ++h) {
      for (int block = 0; block < work.blocks; ++block) {
        int s_first, s_last, head;
        query_place(work, h, block, 0, s_first, head);
        query_place(work, h, block, block_queries(work, block) - 1, s_last, head);
        const int64_t first_position = length - step.news + s_first, last_position = length - step.news + s_last;
        const int64_t start = layer.window > 0 ? std::max<int64_t>(0, first_position + 1 - layer.window) : 0;
        // the tiles its queries see, from the kSpan grid (the walk's steps) on; the parts of the kPartTiles grid
        const int64_t first_tile = start / attn::kKeyTile / attn::kSpan * attn::kSpan;
        const int64_t end_tile = last_position / attn::kKeyTile + 1;
        const int grid = static_cast<int>((end_tile - 1) / attn::kPartTiles - first_tile / attn::kPartTiles + 1);
        const int parts = work.blocks == 1 ? grid : 1;  // otherwise one task walks the parts in turn
        if (parts > 1) work.merges.push_back(static_cast<int>(work.tasks.size()));
        for (int64_t from = first_tile; from < end_tile; from = attn::part_end(from)) {
          const int64_t to = parts == 1 ? end_tile : std::min(end_tile, attn::part_end(from));
          work.tasks.push_back(Task{b, h, block, parts, from, to, parts == 1 ? -1 : scratch});
          if (parts > 1) {
            scratch += block_queries(work, block);
          } else {
            break;
          }
        }
      }
    }
  }
  if (scratch > 0) work.partial.reset(new attn::Running[static_cast<size_t>(scratch)]);
}

template <class C>
struct Kernel {
  using T = typename C::Value;
  static constexpr bool kScaled = std::is_same_v<T, int8_t>;  // int8 and int4: scales per kv head and channel
  static constexpr bool kInt4 = std::is_same_v<C, attn::Int4Cache>;

  Kernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo kernel_info(info);
    layer_.heads = static_cast<int>(kernel_info.GetAttribute<int64_t>("num_heads"));
    layer_.kv_heads = static_cast<int>(kernel_info.GetAttribute<int64_t>("kv_num_heads"));
    layer_.scale = kernel_info.GetAttribute<float>("scale");
    layer_.interleaved = kernel_info.GetAttribute<int64_t>("rotary_interleaved") != 0;
    rotary_ = kernel_info.GetAttribute<int64_t>("do_rotary") != 0;
    layer_.window = static_cast<int>(kernel_info.GetAttribute<int64_t>("local_window_size"));
    if (layer_.heads <= 0 || layer_.kv_heads <= 0 || layer_.heads % layer_.kv_heads)
      ORT_CXX_API_THROW("phi_api.Attention: num_heads must be a multiple of kv_num_heads", ORT_INVALID_ARGUMENT);
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const Ort::ConstValue qkv = ctx.GetInput(0);
    const Ort::ConstValue past_key = ctx.GetInput(3), past_value = ctx.GetInput(4);
    const std::vector<int64_t> input = qkv.GetTensorTypeAndShapeInfo().GetShape();
    const std::vector<int64_t> cache = past_key.GetTensorTypeAndShapeInfo().GetShape();
    if (input.size() != 3 || cache.size() != 4 || cache[0] != input[0] || cache[1] != layer_.kv_heads)
      ORT_CXX_API_THROW("phi_api.Attention: unexpected shapes", ORT_INVALID_ARGUMENT);
    attn::Layer layer = layer_;
    layer.head_size = static_cast<int>(input[2] / (layer.heads + 2 * layer.kv_heads));
    if (layer.head_size % 16 || layer.head_size > attn::kMaxHeadSize || cache[2] % attn::kKeyTile ||
        input[2] != (layer.heads + 2 * layer.kv_heads) * layer.head_size ||
        cache[3] != C::token_width(layer.head_size) || (kInt4 && layer.head_size % 32))
      ORT_CXX_API_THROW("phi_api.Attention: unsupported head size or cache length", ORT_INVALID_ARGUMENT);
    const Ort::ConstValue cos = ctx.GetInput(7), sin = ctx.GetInput(8);
    const std::vector<int64_t> table = cos.GetTensorTypeAndShapeInfo().GetShape();
    layer.rot_half = rotary_ ? static_cast<int>(table.back()) : 0;
    const int rows = static_cast<int>(input[0]), news = static_cast<int>(input[1]);
    Ort::UnownedValue out = ctx.GetOutput(0, {input[0], input[1], layer.heads * layer.head_size});
    Ort::UnownedValue present_key = ctx.GetOutput(1, cache), present_value = ctx.GetOutput(2, cache);
    T* keys = present_key.GetTensorMutableData<T>();
    T* values = present_value.GetTensorMutableData<T>();
    const size_t bytes = static_cast<size_t>(cache[0] * cache[1] * cache[2] * cache[3]) * sizeof(T);
    if (keys != past_key.GetTensorData<T>()) std::memcpy(keys, past_key.GetTensorData<T>(), bytes);
    if (values != past_value.GetTensorData<T>()) std::memcpy(values, past_value.GetTensorData<T>(), bytes);
    const int32_t* seqlens = ctx.GetInput(5).GetTensorData<int32_t>();
    std::vector<int32_t> lengths(rows);
    for (int b = 0; b < rows; ++b) {
      lengths[b] = seqlens[b] + 1;
      if (lengths[b] < news || lengths[b] > cache[2] || (rotary_ && lengths[b] > table[0]))
        ORT_CXX_API_THROW("phi_api.Attention: a row's length is out of range", ORT_INVALID_ARGUMENT);
    }
    attn::Step<T> step{qkv.GetTensorData<float>(), keys, values, cache[2], static_cast<int>(cache[3]),
                       lengths.data(),
                       rotary_ ? cos.GetTensorData<float>() : nullptr, rotary_ ? sin.GetTensorData<float>() : nullptr,
                       rotary_ ? table[0] : 0, kScaled ? ctx.GetInput(12).GetTensorData<float>() : nullptr,
                       kScaled ? ctx.GetInput(13).GetTensorData<float>() : nullptr, out.GetTensorMutableData<float>(),
                       rows, news};
    const int group = layer.heads / layer.kv_heads;
    Work<C> work{&step, &layer, (news * group + attn::kQueryBlock - 1) / attn::kQueryBlock, {}, {}, {}};
    plan(work);
    ctx.ParallelFor(write_task<C>, static_cast<size_t>(rows) * layer.kv_heads, 0, &work);
    ctx.ParallelFor(attend_task<C>, work.tasks.size(), 0, &work);
    if (!work.merges.empty()) ctx.ParallelFor(merge_task<C>, work.merges.size(), 0, &work);
  }

 private:
  attn::Layer layer_{};
  bool rotary_ = false;
};

template <class C>
struct Op : Ort::CustomOpBase<Op<C>, Kernel<C>> {
  static constexpr ONNXTensorElementDataType kCache =
      Kernel<C>::kScaled ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel<C>(api, info); }
  const char* GetName() const {
    return Kernel<C>::kInt4 ? "Attention4" : Kernel<C>::kScaled ? "Attention" : "AttentionFloat";
  }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 14; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    if (index == 3 || index == 4) return kCache;
    if (index == 5 || index == 6) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    if (index == 9) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    const bool absent = index == 1 || index == 2 || (index >= 9 && index <= 11) || (!Kernel<C>::kScaled && index >= 12);
    return absent ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t index) const {
    return index == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : kCache;
  }
};

}  // namespace attn_op
