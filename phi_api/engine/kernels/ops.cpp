// phi-api's custom operators for ONNX Runtime, in one library: phi_api.Attention, phi_api.Attention4 and
// phi_api.AttentionFloat (attention_op.h) and phi_api.Q4MatMul.
//
// phi_api.Q4MatMul: the kernel of q4_kernel.h in the decoder graph, in place of
// MatMulNBits (4 bits, blocks of 128, no zero points; see rewrite.py). Inputs: A [..., K] float, the repacked
// weights (uint8, reference.repack's layout) and their scales [N / 16, K / 128, 16] float; attributes K and N; output
// [..., N] float.
//
// The rows of A go through the kernel 8 at a time (q4::kMaxRows); the columns are shared among ONNX Runtime's
// intra-op threads through the kernel context (the session's own pool: no second pool competing for the cores). A task is a few
// groups of 16 columns, so that a chunk of rows after the first finds that task's weights still in the cache.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <algorithm>
#include <mutex>
#include <vector>

#include "attention_op.h"
#include "q4_kernel.h"

namespace {

constexpr int kGroupsPerTask = 4;  // 64 columns: at K = 8192, 256 KB of weights, which stay in L2 across chunks

struct Work {
  const uint8_t* w;
  const float* w_scales;
  const float* x;
  float* y;
  int8_t* q;
  float* a_scales;
  int32_t* a_sums;
  int64_t m;
  int k, n, groups;
};

void quantize_task(void* data, size_t index) {
  const Work& work = *static_cast<const Work*>(data);
  const int blocks = q4::block_count(work.k);
  const int64_t r0 = static_cast<int64_t>(index) * q4::kMaxRows;
  const int rows = static_cast<int>(std::min<int64_t>(q4::kMaxRows, work.m - r0));
  q4::quantize_rows(work.x + r0 * work.k, rows, work.k, work.q + r0 * work.k, work.a_scales + r0 * blocks,
                    work.a_sums + r0 * blocks);
}

template <int Bits>
void columns_task(void* data, size_t index) {
  const Work& work = *static_cast<const Work*>(data);
  const int g0 = static_cast<int>(index) * kGroupsPerTask;
  const int g1 = std::min(work.groups, g0 + kGroupsPerTask);
  q4::all_rows<Bits>(work.w, work.w_scales, work.q, work.a_scales, work.a_sums, work.y, work.m, work.k, work.n, g0, g1);
}

template <int Bits>
struct MatMulKernel {
  MatMulKernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo kernel_info(info);
    k_ = static_cast<int>(kernel_info.GetAttribute<int64_t>("K"));
    n_ = static_cast<int>(kernel_info.GetAttribute<int64_t>("N"));
    if (k_ <= 0 || n_ <= 0 || k_ % 16 || n_ % 16)
      ORT_CXX_API_THROW("Q4MatMul and Q8MatMul take K and N multiples of 16", ORT_INVALID_ARGUMENT);
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const Ort::ConstValue a = ctx.GetInput(0);
    std::vector<int64_t> shape = a.GetTensorTypeAndShapeInfo().GetShape();
    if (shape.empty() || shape.back() != k_) ORT_CXX_API_THROW("Q4MatMul and Q8MatMul: A's last dimension is not K", ORT_INVALID_ARGUMENT);
    int64_t m = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) m *= shape[i];
    shape.back() = n_;
    Ort::UnownedValue y = ctx.GetOutput(0, shape);
    if (m == 0) return;
    const int blocks = q4::block_count(k_);
    // per call, not per kernel: ONNX Runtime may run one session from several threads at once
    std::vector<int8_t> q(static_cast<size_t>(m) * k_);
    std::vector<float> a_scales(static_cast<size_t>(m) * blocks);
    std::vector<int32_t> a_sums(static_cast<size_t>(m) * blocks);
    Work work{ctx.GetInput(1).GetTensorData<uint8_t>(), ctx.GetInput(2).GetTensorData<float>(),
              a.GetTensorData<float>(), y.GetTensorMutableData<float>(), q.data(), a_scales.data(),
              a_sums.data(), m, k_, n_, n_ / 16};
    const size_t chunks = static_cast<size_t>((m + q4::kMaxRows - 1) / q4::kMaxRows);
    if (chunks == 1) {
      quantize_task(&work, 0);
    } else {
      ctx.ParallelFor(quantize_task, chunks, 0, &work);
    }
    ctx.ParallelFor(columns_task<Bits>, static_cast<size_t>((work.groups + kGroupsPerTask - 1) / kGroupsPerTask), 0, &work);
  }

 private:
  int k_ = 0, n_ = 0;
};

template <int Bits>
struct MatMulOp : Ort::CustomOpBase<MatMulOp<Bits>, MatMulKernel<Bits>> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new MatMulKernel<Bits>(api, info); }
  const char* GetName() const { return Bits == 4 ? "Q4MatMul" : "Q8MatMul"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

extern "C" {

// Called by ONNX Runtime for each session that registers this library. The operator and its domains live as long
// as the library (ONNX Runtime keeps pointers to them), hence the static storage.
OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  static MatMulOp<4> op;
  static MatMulOp<8> op8;
  static attn_op::Op<attn::Int8Cache> attention;
  static attn_op::Op<attn::FloatCache> float_attention;
  static attn_op::Op<attn::Int4Cache> int4_attention;
  static std::mutex mutex;
  static std::vector<Ort::CustomOpDomain> domains;
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  try {
    std::lock_guard<std::mutex> hold(mutex);
    Ort::CustomOpDomain domain("phi_api");
    domain.Add(&op);
    domain.Add(&op8);
    domain.Add(&attention);
    domain.Add(&float_attention);
    domain.Add(&int4_attention);
    Ort::UnownedSessionOptions(options).Add(domain);
    domains.push_back(std::move(domain));
  } catch (const Ort::Exception& error) {
    return Ort::GetApi().CreateStatus(error.GetOrtErrorCode(), error.what());
  }
  return nullptr;
}

}  // extern "C"
