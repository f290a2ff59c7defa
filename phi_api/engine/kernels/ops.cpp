// phi-api's custom operators for ONNX Runtime, in one library: phi_api.Attention, phi_api.Attention4 and
// phi_api.AttentionFloat (attention_op.h), phi_api.Q4MatMul and phi_api.Q8MatMul, and phi_api.BF16MatMul.
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
#include "bf16_kernel.h"
#include "q4_kernel.h"

namespace {

constexpr int kGroupsPerTask = 4;  // 64 columns: at K = 8192, 256 KB of weights, which stay in L2 across chunks
// bfloat16 weights take 4x the bytes of 4-bit ones: 32 columns a task (at K = 1,536, 96 KB; 18 tasks for N = 576)
constexpr int kBf16GroupsPerTask = 2;

// A matrix operator's output [..., N] for its input A [..., K], and in `m` A's count of rows (0: nothing to compute).
Ort::UnownedValue rows_and_output(Ort::KernelContext& ctx, int k, int n, int64_t& m) {
  const Ort::ConstValue a = ctx.GetInput(0);
  std::vector<int64_t> shape = a.GetTensorTypeAndShapeInfo().GetShape();
  if (shape.empty() || shape.back() != k) ORT_CXX_API_THROW("phi_api's matrix operators: A's last dimension is not K", ORT_INVALID_ARGUMENT);
  m = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) m *= shape[i];
  shape.back() = n;
  return ctx.GetOutput(0, shape);
}

// K and N, the attributes every matrix operator has, checked: multiples of 16.
void read_k_n(const OrtKernelInfo* info, int& k, int& n) {
  Ort::ConstKernelInfo kernel_info(info);
  k = static_cast<int>(kernel_info.GetAttribute<int64_t>("K"));
  n = static_cast<int>(kernel_info.GetAttribute<int64_t>("N"));
  if (k <= 0 || n <= 0 || k % 16 || n % 16)
    ORT_CXX_API_THROW("phi_api's matrix operators take K and N multiples of 16", ORT_INVALID_ARGUMENT);
}

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

// What the matrix kernels share: K and N, the output's shape, and nothing to do for no rows; Derived::run computes
// the m rows of A into y.
template <class Derived>
struct MatrixKernel {
  MatrixKernel(const OrtApi&, const OrtKernelInfo* info) { read_k_n(info, k_, n_); }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    int64_t m = 0;
    Ort::UnownedValue y = rows_and_output(ctx, k_, n_, m);
    if (m > 0) static_cast<Derived*>(this)->run(ctx, m, y.GetTensorMutableData<float>());
  }

 protected:
  int k_ = 0, n_ = 0;
};

template <int Bits>
void columns_task(void* data, size_t index) {
  const Work& work = *static_cast<const Work*>(data);
  const int g0 = static_cast<int>(index) * kGroupsPerTask;
  const int g1 = std::min(work.groups, g0 + kGroupsPerTask);
  q4::all_rows<Bits>(work.w, work.w_scales, work.q, work.a_scales, work.a_sums, work.y, work.m, work.k, work.n, g0, g1);
}

template <int Bits>
struct MatMulKernel : MatrixKernel<MatMulKernel<Bits>> {
  static constexpr const char* kName = Bits == 4 ? "Q4MatMul" : "Q8MatMul";
  static constexpr size_t kInputs = 3;  // A, the weights, their scales
  static constexpr ONNXTensorElementDataType kWeights = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;

  using MatrixKernel<MatMulKernel<Bits>>::MatrixKernel;

  void run(Ort::KernelContext& ctx, int64_t m, float* y) {
    const int k = this->k_, n = this->n_;  // a dependent base's members
    const int blocks = q4::block_count(k);
    // per call, not per kernel: ONNX Runtime may run one session from several threads at once
    std::vector<int8_t> q(static_cast<size_t>(m) * k);
    std::vector<float> a_scales(static_cast<size_t>(m) * blocks);
    std::vector<int32_t> a_sums(static_cast<size_t>(m) * blocks);
    Work work{ctx.GetInput(1).GetTensorData<uint8_t>(), ctx.GetInput(2).GetTensorData<float>(),
              ctx.GetInput(0).GetTensorData<float>(), y, q.data(), a_scales.data(), a_sums.data(), m, k, n, n / 16};
    const size_t chunks = static_cast<size_t>((m + q4::kMaxRows - 1) / q4::kMaxRows);
    if (chunks == 1) {
      quantize_task(&work, 0);
    } else {
      ctx.ParallelFor(quantize_task, chunks, 0, &work);
    }
    ctx.ParallelFor(columns_task<Bits>, static_cast<size_t>((work.groups + kGroupsPerTask - 1) / kGroupsPerTask), 0, &work);
  }
};

struct Bf16Work {
  const uint16_t* w;
  const float* x;
  float* y;
  int64_t m;
  int k, n, groups;
};

void bf16_columns_task(void* data, size_t index) {
  const Bf16Work& work = *static_cast<const Bf16Work*>(data);
  const int g0 = static_cast<int>(index) * kBf16GroupsPerTask;
  bf16::all_rows(work.w, work.x, work.y, work.m, work.k, work.n, g0, std::min(work.groups, g0 + kBf16GroupsPerTask));
}

// phi_api.BF16MatMul: A [..., K] float times weights stored as bfloat16 (uint16, pack_bf16's layout in reference.py),
// summed in float32 (bf16_kernel.h); attributes K and N (multiples of 16); output [..., N] float.
struct Bf16Kernel : MatrixKernel<Bf16Kernel> {
  static constexpr const char* kName = "BF16MatMul";
  static constexpr size_t kInputs = 2;  // A, the weights
  static constexpr ONNXTensorElementDataType kWeights = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16;

  using MatrixKernel<Bf16Kernel>::MatrixKernel;

  void run(Ort::KernelContext& ctx, int64_t m, float* y) {
    Bf16Work work{ctx.GetInput(1).GetTensorData<uint16_t>(), ctx.GetInput(0).GetTensorData<float>(), y, m, k_, n_,
                  n_ / 16};
    ctx.ParallelFor(bf16_columns_task, static_cast<size_t>((work.groups + kBf16GroupsPerTask - 1) / kBf16GroupsPerTask), 0, &work);
  }
};

// One operator class for the matrix kernels: each Kernel names its operator, its input count and its weights' type.
template <class Kernel>
struct MatrixOp : Ort::CustomOpBase<MatrixOp<Kernel>, Kernel> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel(api, info); }
  const char* GetName() const { return Kernel::kName; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return Kernel::kInputs; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 1 ? Kernel::kWeights : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

extern "C" {

// Called by ONNX Runtime for each session that registers this library. The operator and its domains live as long
// as the library (ONNX Runtime keeps pointers to them), hence the static storage.
OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  static MatrixOp<MatMulKernel<4>> op;
  static MatrixOp<MatMulKernel<8>> op8;
  static MatrixOp<Bf16Kernel> bf16_op;
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
    domain.Add(&bf16_op);
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
