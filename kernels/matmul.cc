// matmul_forward / matmul_backward in fp32, bf16 or fp16, alone or with GELU or a residual fused: GEMMs through
// OpenBLAS (kernels/blas.h; half operands widened) or cuBLAS/cuBLASLt (kernels/cuda/matmul.cu), bias and its gradient
// here.
#include <algorithm>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/blas.h"
#include "kernels/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "kernels/widened.h"
#include "runtime/parallel.h"
#include "runtime/sim/sim_api.h"
#include "runtime/status.h"

namespace zero::kernels {
namespace {

using detail::check_matrix;
using detail::given;

constexpr int64_t kRowBlock = 64;

struct MatmulDims {
  int64_t n = 0, c = 0, oc = 0;
  DType operands = DType::kF32;  // inp, weight and dout: fp32, bf16 or fp16
};

bool is_half(DType t) { return t == DType::kBF16 || t == DType::kF16; }

// weight (OC, C) fixes C and OC; inp (N, C) fixes N and the operands' dtype.
absl::StatusOr<MatmulDims> matmul_dims(absl::string_view op, const Tensor& inp, const Tensor& weight) {
  ZERO_RETURN_IF_ERROR(detail::check_dims(op, "weight", weight, 2));
  const DType operands = is_half(inp.dtype()) ? inp.dtype() : DType::kF32;
  const MatmulDims d{detail::num_rows(inp), weight.size(1), weight.size(0), operands};
  if (d.c == 0 || d.oc == 0) return absl::InvalidArgumentError(absl::StrCat(op, ": empty weight ", weight.to_string()));
  ZERO_RETURN_IF_ERROR(check_matrix(op, "weight", weight, operands, inp.device(), d.oc, d.c));
  ZERO_RETURN_IF_ERROR(check_matrix(op, "inp", inp, operands, inp.device(), d.n, d.c));
  ZERO_RETURN_IF_ERROR(detail::check_backend(op, inp.device()));
  return d;
}

// A result or bias `t`: fp32, or the operands' dtype.
absl::Status check_result(absl::string_view op, absl::string_view name, const Tensor& t, const MatmulDims& d,
                          Device device, int64_t rows, int64_t cols) {
  if (t.dtype() != DType::kF32 && t.dtype() != d.operands && d.operands != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must be fp32 or ", dtype_name(d.operands),
                                                   " (the operands' dtype), got ", t.to_string()));
  }
  return check_matrix(op, name, t, t.dtype() == d.operands ? d.operands : DType::kF32, device, rows, cols);
}

absl::Status check_bias(absl::string_view op, absl::string_view name, const Tensor& bias, const MatmulDims& d,
                        Device device) {
  return given(bias) ? check_result(op, name, bias, d, device, 1, d.oc) : absl::OkStatus();
}

// A tensor argument and its name.
using Named = std::pair<absl::string_view, const Tensor*>;

// InvalidArgument where `written`'s bytes overlap any of `others'` (an undefined tensor overlaps nothing).
absl::Status check_apart(absl::string_view op, absl::string_view written_name, const Tensor& written,
                         std::initializer_list<Named> others) {
  for (const auto& [name, other] : others) {
    if (bytes_overlap(written.data(), static_cast<int64_t>(written.nbytes()), other->data(),
                      static_cast<int64_t>(other->nbytes()))) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", written_name, " must not overlap ", name, "; give it a buffer of its own"));
    }
  }
  return absl::OkStatus();
}

// A forward's arguments, checked, and its dims: dims from inp and weight, out (N, OC) a result, the optional bias, out
// apart from all three.
absl::StatusOr<MatmulDims> check_forward_args(absl::string_view op, const Tensor& out, const Tensor& inp,
                                              const Tensor& weight, const Tensor& bias) {
  ZERO_ASSIGN_OR_RETURN(const MatmulDims d, matmul_dims(op, inp, weight));
  ZERO_RETURN_IF_ERROR(check_result(op, "out", out, d, inp.device(), d.n, d.oc));
  ZERO_RETURN_IF_ERROR(check_bias(op, "bias", bias, d, inp.device()));
  ZERO_RETURN_IF_ERROR(check_apart(op, "out", out, {{"inp", &inp}, {"weight", &weight}, {"bias", &bias}}));
  return d;
}

// matmul_backward's arguments, checked, and its dims: dims from inp and weight, dout an operand with them (cuBLAS
// takes both of one dtype), each result apart from the others and from what is read (dout, inp, weight and `pre`,
// GELU's input, where given). dinp_name: what the caller calls dinp.
absl::StatusOr<MatmulDims> check_backward_args(absl::string_view op, absl::string_view dinp_name, const Tensor& dinp,
                                               const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                               const Tensor& inp, const Tensor& weight, const Tensor& pre = Tensor()) {
  ZERO_ASSIGN_OR_RETURN(const MatmulDims d, matmul_dims(op, inp, weight));
  const Device dev = inp.device();
  ZERO_RETURN_IF_ERROR(check_matrix(op, "dout", dout, d.operands, dev, d.n, d.oc));
  ZERO_RETURN_IF_ERROR(check_result(op, "dweight", dweight, d, dev, d.oc, d.c));
  ZERO_RETURN_IF_ERROR(check_bias(op, "dbias", dbias, d, dev));
  if (given(dinp)) ZERO_RETURN_IF_ERROR(check_result(op, dinp_name, dinp, d, dev, d.n, d.c));
  for (const auto& [name, written] : {Named{dinp_name, &dinp}, {"dweight", &dweight}, {"dbias", &dbias}}) {
    ZERO_RETURN_IF_ERROR(
        check_apart(op, name, *written, {{"dout", &dout}, {"inp", &inp}, {"weight", &weight}, {"pre", &pre}}));
  }
  ZERO_RETURN_IF_ERROR(check_apart(op, dinp_name, dinp, {{"dweight", &dweight}, {"dbias", &dbias}}));
  ZERO_RETURN_IF_ERROR(check_apart(op, "dweight", dweight, {{"dbias", &dbias}}));
  return d;
}

// The fp32 forward on the CPU: the bias copied into out, then the GEMM adds to it.
void cpu_forward(const MatmulDims& d, const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  float* o = out.data_as<float>();
  if (given(bias)) {
    const float* b = bias.data_as<float>();
    for_blocks(d.n, kRowBlock, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::copy(b, b + d.oc, o + r * d.oc);
    });
  }
  // out (N, OC) = inp (N, C) · weight^T (C, OC) [+ out holding the bias]
  detail::tiled_sgemm({.trans_a = false,
                       .trans_b = true,
                       .m = d.n,
                       .n = d.oc,
                       .k = d.c,
                       .a = inp.data_as<float>(),
                       .lda = d.c,
                       .b = weight.data_as<float>(),
                       .ldb = d.c,
                       .beta = given(bias) ? 1.0f : 0.0f,
                       .c = o,
                       .ldc = d.oc});
}

// The fp32 backward on the CPU: dinp = dout · weight where given, dweight += dout^T · inp, dbias += dout's column sums
// where given.
void cpu_backward(const MatmulDims& d, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                  const Tensor& dout, const Tensor& inp, const Tensor& weight) {
  const float* g = dout.data_as<float>();
  if (given(dinp)) {
    // dinp (N, C) = dout (N, OC) · weight (OC, C)
    detail::tiled_sgemm({.trans_a = false,
                         .trans_b = false,
                         .m = d.n,
                         .n = d.c,
                         .k = d.oc,
                         .a = g,
                         .lda = d.oc,
                         .b = weight.data_as<float>(),
                         .ldb = d.c,
                         .beta = 0.0f,
                         .c = dinp.data_as<float>(),
                         .ldc = d.c});
  }
  // dweight (OC, C) += dout^T (OC, N) · inp (N, C)
  detail::tiled_sgemm({.trans_a = true,
                       .trans_b = false,
                       .m = d.oc,
                       .n = d.c,
                       .k = d.n,
                       .a = g,
                       .lda = d.oc,
                       .b = inp.data_as<float>(),
                       .ldb = d.c,
                       .beta = 1.0f,
                       .c = dweight.data_as<float>(),
                       .ldc = d.c});
  if (given(dbias)) {
    add_column_sums(d.n, d.oc, dbias.data_as<float>(), [&](int64_t r, int64_t c) { return g[r * d.oc + c]; });
  }
}

}  // namespace

absl::Status matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                            [[maybe_unused]] Fp32Gemm fp32_gemm) {  // read on CUDA alone
  ZERO_ASSIGN_OR_RETURN(const MatmulDims d, check_forward_args("matmul_forward", out, inp, weight, bias));
  if (inp.device().is_sim()) {
    return launch_on_sim(
        inp.device(), "matmul_forward", {reads(inp), reads(weight), reads(bias), writes(out)},
        [=](HostTensors& host) { return matmul_forward(host(out), host(inp), host(weight), host(bias)); });
  }
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda() && d.operands != DType::kF32) {
    return cuda::matmul_forward_half(inp.device().index, out.data(), out.dtype(), nullptr, nullptr, inp.data(),
                                     weight.data(), bias.data(), bias.dtype(), d.operands, d.n, d.c, d.oc);
  }
  if (inp.device().is_cuda()) {
    return cuda::matmul_forward(inp.device().index, out.data_as<float>(), inp.data_as<float>(), weight.data_as<float>(),
                                bias.data_as<float>(), d.n, d.c, d.oc, fp32_gemm == Fp32Gemm::kTf32);
  }
#endif
  if (d.operands != DType::kF32) {
    using enum detail::Role;
    return detail::on_widened({{out, kOut}, {inp, kIn}, {weight, kIn}, {bias, kIn}},
                              [](const auto& t) { return matmul_forward(t[0], t[1], t[2], t[3]); });
  }
  cpu_forward(d, out, inp, weight, bias);
  return absl::OkStatus();
}

absl::Status matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                             const Tensor& inp, const Tensor& weight,
                             [[maybe_unused]] Fp32Gemm fp32_gemm) {  // read on CUDA alone
  ZERO_ASSIGN_OR_RETURN(const MatmulDims d,
                        check_backward_args("matmul_backward", "dinp", dinp, dweight, dbias, dout, inp, weight));
  const Device dev = inp.device();
  if (d.n == 0) return absl::OkStatus();
  if (dev.is_sim()) {
    return launch_on_sim(
        dev, "matmul_backward", {reads(dout), reads(inp), reads(weight), writes(dinp), writes(dweight), writes(dbias)},
        [=](HostTensors& host) {
          return matmul_backward(host(dinp), host(dweight), host(dbias), host(dout), host(inp), host(weight));
        });
  }
#if ZERO_HAS_CUDA
  if (dev.is_cuda() && d.operands != DType::kF32) {
    return cuda::matmul_backward_half(dev.index, dinp.data(), dinp.dtype(), nullptr, dweight.data(), dweight.dtype(),
                                      dbias.data(), dbias.dtype(), dout.data(), inp.data(), weight.data(), d.operands,
                                      d.n, d.c, d.oc);
  }
  if (dev.is_cuda()) {
    return cuda::matmul_backward(dev.index, dinp.data_as<float>(), dweight.data_as<float>(), dbias.data_as<float>(),
                                 dout.data_as<float>(), inp.data_as<float>(), weight.data_as<float>(), d.n, d.c, d.oc,
                                 fp32_gemm == Fp32Gemm::kTf32);
  }
#endif
  if (d.operands != DType::kF32) {
    using enum detail::Role;
    return detail::on_widened(
        {{dinp, kOut}, {dweight, kInOut}, {dbias, kInOut}, {dout, kIn}, {inp, kIn}, {weight, kIn}},
        [](const auto& t) { return matmul_backward(t[0], t[1], t[2], t[3], t[4], t[5]); });
  }
  cpu_backward(d, dinp, dweight, dbias, dout, inp, weight);
  return absl::OkStatus();
}

absl::Status matmul_gelu_forward(const Tensor& out, const Tensor& pre, const Tensor& inp, const Tensor& weight,
                                 const Tensor& bias, Fp32Gemm fp32_gemm) {
  constexpr absl::string_view op = "matmul_gelu_forward";
  // d is read on CUDA alone.
  ZERO_ASSIGN_OR_RETURN([[maybe_unused]] const MatmulDims d, check_forward_args(op, out, inp, weight, bias));
  ZERO_RETURN_IF_ERROR(detail::check_like(op, "pre", pre, out));
  ZERO_RETURN_IF_ERROR(
      check_apart(op, "pre", pre, {{"out", &out}, {"inp", &inp}, {"weight", &weight}, {"bias", &bias}}));
  if (inp.device().is_sim()) {
    return launch_on_sim(inp.device(), "matmul_gelu_forward",
                         {reads(inp), reads(weight), reads(bias), writes(out), writes(pre)}, [=](HostTensors& host) {
                           return matmul_gelu_forward(host(out), host(pre), host(inp), host(weight), host(bias));
                         });
  }
  if (out.dtype() == DType::kF32) {
    // fp32 pre is GELU's input unrounded: the two calls give the fused result.
    ZERO_RETURN_IF_ERROR(matmul_forward(pre, inp, weight, bias, fp32_gemm));
    return gelu_forward(out, pre);
  }
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::matmul_forward_half(inp.device().index, out.data(), out.dtype(), pre.data(), nullptr, inp.data(),
                                     weight.data(), bias.data(), bias.dtype(), d.operands, d.n, d.c, d.oc);
  }
#endif
  using enum detail::Role;
  return detail::on_widened({{out, kOut}, {pre, kOut}, {inp, kIn}, {weight, kIn}, {bias, kIn}},
                            [](const auto& t) { return matmul_gelu_forward(t[0], t[1], t[2], t[3], t[4]); });
}

absl::Status matmul_residual_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                     const Tensor& residual, Fp32Gemm fp32_gemm) {
  constexpr absl::string_view op = "matmul_residual_forward";
  // d is read on CUDA alone.
  ZERO_ASSIGN_OR_RETURN([[maybe_unused]] const MatmulDims d, check_forward_args(op, out, inp, weight, bias));
  ZERO_RETURN_IF_ERROR(detail::check_like(op, "residual", residual, out));
  ZERO_RETURN_IF_ERROR(check_apart(op, "out", out, {{"residual", &residual}}));
  if (inp.device().is_sim()) {
    return launch_on_sim(
        inp.device(), "matmul_residual_forward", {reads(inp), reads(weight), reads(bias), reads(residual), writes(out)},
        [=](HostTensors& host) {
          return matmul_residual_forward(host(out), host(inp), host(weight), host(bias), host(residual));
        });
  }
  if (out.dtype() == DType::kF32) {
    // fp32 out holds the sum as fp32 rounds it either way: the two calls give the fused result.
    ZERO_RETURN_IF_ERROR(matmul_forward(out, inp, weight, bias, fp32_gemm));
    return residual_forward(out, out, residual);
  }
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::matmul_forward_half(inp.device().index, out.data(), out.dtype(), nullptr, residual.data(), inp.data(),
                                     weight.data(), bias.data(), bias.dtype(), d.operands, d.n, d.c, d.oc);
  }
#endif
  using enum detail::Role;
  return detail::on_widened({{out, kOut}, {inp, kIn}, {weight, kIn}, {bias, kIn}, {residual, kIn}},
                            [](const auto& t) { return matmul_residual_forward(t[0], t[1], t[2], t[3], t[4]); });
}

absl::Status matmul_backward_through_gelu(const Tensor& dpre, const Tensor& dweight, const Tensor& dbias,
                                          const Tensor& dout, const Tensor& inp, const Tensor& pre,
                                          const Tensor& weight, Fp32Gemm fp32_gemm) {
  constexpr absl::string_view op = "matmul_backward_through_gelu";
  ZERO_ASSIGN_OR_RETURN(const MatmulDims d,
                        check_backward_args(op, "dpre", dpre, dweight, dbias, dout, inp, weight, pre));
  if (d.n > 0 && !given(dpre)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": dpre is its result; give it a tensor"));
  }
  ZERO_RETURN_IF_ERROR(detail::check_like(op, "pre", pre, dpre));
  const Device dev = inp.device();
  if (d.n == 0) return absl::OkStatus();
  if (dev.is_sim()) {
    return launch_on_sim(
        dev, "matmul_backward_through_gelu",
        {reads(dout), reads(inp), reads(pre), reads(weight), writes(dpre), writes(dweight), writes(dbias)},
        [=](HostTensors& host) {
          return matmul_backward_through_gelu(host(dpre), host(dweight), host(dbias), host(dout), host(inp), host(pre),
                                              host(weight));
        });
  }
  if (dpre.dtype() == DType::kF32) {
    // fp32 dpre holds the product unrounded: the two calls give the fused result.
    ZERO_RETURN_IF_ERROR(matmul_backward(dpre, dweight, dbias, dout, inp, weight, fp32_gemm));
    return gelu_backward(dpre, pre, dpre);
  }
#if ZERO_HAS_CUDA
  if (dev.is_cuda()) {
    return cuda::matmul_backward_half(dev.index, dpre.data(), dpre.dtype(), pre.data(), dweight.data(), dweight.dtype(),
                                      dbias.data(), dbias.dtype(), dout.data(), inp.data(), weight.data(), d.operands,
                                      d.n, d.c, d.oc);
  }
#endif
  using enum detail::Role;
  return detail::on_widened(
      {{dpre, kOut}, {dweight, kInOut}, {dbias, kInOut}, {dout, kIn}, {inp, kIn}, {pre, kIn}, {weight, kIn}},
      [](const auto& t) { return matmul_backward_through_gelu(t[0], t[1], t[2], t[3], t[4], t[5], t[6]); });
}

}  // namespace zero::kernels
