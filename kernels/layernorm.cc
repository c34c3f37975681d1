// LayerNorm over the last dim, forward (saving mean and rstd) and backward, in fp32, bf16 or fp16.
#include <cmath>
#include <vector>

#include "kernels/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/parallel.h"
#include "runtime/sim/sim_api.h"
#include "runtime/status.h"

namespace zero::kernels {
namespace {

using detail::check_matrix;
using detail::given;

constexpr int64_t kRowBlock = 16;
constexpr int64_t kParamRows = 64;   // backward: rows per block of dweight and dbias partial sums
constexpr int64_t kParamCols = 256;  // backward: columns per thread block adding up those partial sums

// inp (N, C) fixes N, C and the dtype (fp32, bf16 or fp16) of weight (C) and every other (N, C) or (C) argument, which
// are checked here too; mean, rstd (N) are fp32.
absl::Status check_layernorm(absl::string_view op, const Tensor& inp, const Tensor& weight, const Tensor& mean,
                             const Tensor& rstd, std::initializer_list<std::pair<const char*, const Tensor*>> rows_c,
                             std::initializer_list<std::pair<const char*, const Tensor*>> vectors_c) {
  const int64_t n = detail::num_rows(inp), c = detail::last_dim(inp);
  const Device dev = inp.device();
  const DType dtype = inp.dtype();
  ZERO_RETURN_IF_ERROR(detail::check_floating(op, "inp", inp));
  ZERO_RETURN_IF_ERROR(check_matrix(op, "weight", weight, dtype, dev, 1, c));
  ZERO_RETURN_IF_ERROR(detail::check_numel(op, "mean", mean, DType::kF32, dev, n));
  ZERO_RETURN_IF_ERROR(detail::check_numel(op, "rstd", rstd, DType::kF32, dev, n));
  for (const auto& [name, t] : rows_c) ZERO_RETURN_IF_ERROR(check_matrix(op, name, *t, dtype, dev, n, c));
  for (const auto& [name, t] : vectors_c) ZERO_RETURN_IF_ERROR(check_matrix(op, name, *t, dtype, dev, 1, c));
  return absl::OkStatus();
}

constexpr int kLanes = 8;

// The lanes added pairwise: ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)).
float pairwise_total(const float (&lanes)[kLanes]) {
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// The sum of term(i) over i < c in kLanes interleaved fp32 partial sums (element i into lane i % kLanes) added
// pairwise: one fixed order that vectorizes, whatever the element type (an omp simd reduction's order is the
// compiler's, and differs between fp32 and a half type's loop).
template <typename Term>
float lane_sum(int64_t c, Term term) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= c; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) lanes[k] += term(i + k);
  }
  for (; i < c; ++i) lanes[i % kLanes] += term(i);
  return pairwise_total(lanes);
}

// Row `p` of C elements of dtype T as fp32: the row itself for fp32, else widened exactly into row k of `buffer`
// (sized by widening_buffer; empty for fp32, where no pointer into it is formed).
template <DType T, typename S = StorageOf<T>>
const float* widened_row(const S* p, int64_t c, std::vector<float>& buffer, int64_t k = 0) {
  if constexpr (T == DType::kF32) {
    return p;
  } else {
    float* row = buffer.data() + k * c;
    for (int64_t i = 0; i < c; ++i) row[i] = load_as_float(p, T, i);
    return row;
  }
}

// Room for `rows` rows of C widened elements: none for fp32, whose rows are read where they lie.
template <DType T>
std::vector<float> widening_buffer(int64_t rows, int64_t c) {
  return std::vector<float>(T == DType::kF32 ? 0 : static_cast<size_t>(rows * c));
}

// One row of backward on fp32 rows (C columns; xhat = (x - mean) * rstd): writes dx of dtype T (+ dres where given,
// before the one rounding) and adds g * xhat and g to the fp64 column sums acc_dweight and acc_dbias.
template <DType T, typename S = StorageOf<T>>
void row_backward(S* dx, double* acc_dweight, double* acc_dbias, const float* g, const float* x, const float* w,
                  const S* dres, float mean, float rstd, int64_t c) {
  const auto dnorm = [&](int64_t i) { return g[i] * w[i]; };  // dout * weight
  const float dnorm_mean = lane_sum(c, dnorm) / static_cast<float>(c);
  const float dnorm_xhat_mean =
      lane_sum(c, [&](int64_t i) { return dnorm(i) * ((x[i] - mean) * rstd); }) / static_cast<float>(c);
  for (int64_t i = 0; i < c; ++i) {
    const float xhat = (x[i] - mean) * rstd;
    const float d = (dnorm(i) - dnorm_mean - xhat * dnorm_xhat_mean) * rstd;
    store_from_float(dx, T, i, dres != nullptr ? d + load_as_float(dres, T, i) : d);
    acc_dweight[i] += g[i] * xhat;
    acc_dbias[i] += g[i];
  }
}

// layernorm_forward's rows on the CPU for tensors of dtype T, after inp += *residual where one is given.
template <DType T, typename S = StorageOf<T>>
void forward_rows(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp, const Tensor* residual,
                  const Tensor& weight, const Tensor& bias) {
  const int64_t c = detail::last_dim(inp);
  std::vector<float> params = widening_buffer<T>(2, c);  // weight and bias
  const float* w = widened_row<T>(weight.data_as<const S>(), c, params, 0);
  const float* b = widened_row<T>(bias.data_as<const S>(), c, params, 1);
  for_blocks(detail::num_rows(inp), kRowBlock, [&](int64_t r0, int64_t r1) {
    std::vector<float> row = widening_buffer<T>(1, c);  // x's
    for (int64_t r = r0; r < r1; ++r) {
      S* xs = inp.data_as<S>() + r * c;
      S* y = out.data_as<S>() + r * c;
      if (residual != nullptr) {
        const S* res = residual->data_as<const S>() + r * c;
        for (int64_t i = 0; i < c; ++i) store_from_float(xs, T, i, load_as_float(xs, T, i) + load_as_float(res, T, i));
      }
      const float* x = widened_row<T>(xs, c, row);
      const float m = lane_sum(c, [&](int64_t i) { return x[i]; }) / static_cast<float>(c);
      const float sq = lane_sum(c, [&](int64_t i) { return (x[i] - m) * (x[i] - m); });
      const float s = 1.0f / std::sqrt(sq / static_cast<float>(c) + kLayerNormEps);
      for (int64_t i = 0; i < c; ++i) store_from_float(y, T, i, (x[i] - m) * s * w[i] + b[i]);
      mean.data_as<float>()[r] = m;
      rstd.data_as<float>()[r] = s;
    }
  });
}

// layernorm_backward on the CPU for tensors of dtype T (dres: dresidual's data, or null).
template <DType T, typename S = StorageOf<T>>
void backward_rows(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                   const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd, const S* dres) {
  const int64_t n = detail::num_rows(inp), c = detail::last_dim(inp);
  const S* x = inp.data_as<const S>();
  const S* g = dout.data_as<const S>();
  std::vector<float> w_buffer = widening_buffer<T>(1, c);  // weight
  const float* w = widened_row<T>(weight.data_as<const S>(), c, w_buffer);
  const float* mu = mean.data_as<float>();
  const float* rs = rstd.data_as<float>();
  S* dx = dinp.data_as<S>();
  // dinp = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * weight, per row; dweight and
  // dbias from the same pass: fp64 column sums per block of kParamRows rows (in row order), then the blocks in order.
  const int64_t blocks = ceil_div(n, kParamRows);
  std::vector<double> partial(static_cast<size_t>(blocks * 2 * c), 0.0);  // per block: dweight's c, then dbias's c
  for_blocks(n, kParamRows, [=, &partial](int64_t r0, int64_t r1) {
    double* acc = partial.data() + r0 / kParamRows * 2 * c;
    std::vector<float> rows = widening_buffer<T>(2, c);  // g's and x's row
    for (int64_t r = r0; r < r1; ++r) {
      row_backward<T>(dx + r * c, acc, acc + c, widened_row<T>(g + r * c, c, rows, 0),
                      widened_row<T>(x + r * c, c, rows, 1), w, dres != nullptr ? dres + r * c : nullptr, mu[r], rs[r],
                      c);
    }
  });
  S* dw = dweight.data_as<S>();
  S* db = dbias.data_as<S>();
  for_blocks(c, kParamCols, [&](int64_t c0, int64_t c1) {
    for (int64_t i = c0; i < c1; ++i) {
      double sum_dweight = 0, sum_dbias = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        sum_dweight += partial[(b * 2) * c + i];
        sum_dbias += partial[(b * 2 + 1) * c + i];
      }
      store_from_float(dw, T, i, load_as_float(dw, T, i) + static_cast<float>(sum_dweight));
      store_from_float(db, T, i, load_as_float(db, T, i) + static_cast<float>(sum_dbias));
    }
  });
}

// layernorm_forward, after inp += *residual where one is passed (residual_layernorm_forward).
absl::Status residual_then_layernorm(absl::string_view op, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& inp, const Tensor* residual, const Tensor& weight,
                                     const Tensor& bias) {
  const bool adds = residual != nullptr;
  ZERO_RETURN_IF_ERROR(check_layernorm(op, inp, weight, mean, rstd, {{"out", &out}}, {{"bias", &bias}}));
  if (adds) {
    ZERO_RETURN_IF_ERROR(check_matrix(op, "residual", *residual, inp.dtype(), inp.device(), detail::num_rows(inp),
                                      detail::last_dim(inp)));
  }
  if (inp.device().is_sim()) {
    std::vector<Access> accesses = {reads(weight), reads(bias), writes(out), writes(mean), writes(rstd)};
    const Tensor res = adds ? *residual : Tensor();
    if (adds) {
      accesses.insert(accesses.end(), {writes(inp), reads(res)});
    } else {
      accesses.push_back(reads(inp));
    }
    return launch_on_sim(inp.device(), std::string(op), std::move(accesses), [=](HostTensors& host) {
      const Tensor host_res = host(res);
      return residual_then_layernorm(op, host(out), host(mean), host(rstd), host(inp), adds ? &host_res : nullptr,
                                     host(weight), host(bias));
    });
  }
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::layernorm_forward(inp.device().index, out.data(), mean.data_as<float>(), rstd.data_as<float>(),
                                   inp.data(), adds ? residual->data() : nullptr, weight.data(), bias.data(),
                                   inp.dtype(), detail::num_rows(inp), detail::last_dim(inp));
  }
#endif
  visit_floating(inp.dtype(),
                 [&](auto t) { forward_rows<decltype(t)::value>(out, mean, rstd, inp, residual, weight, bias); });
  return absl::OkStatus();
}

}  // namespace

absl::Status layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                               const Tensor& weight, const Tensor& bias) {
  return residual_then_layernorm("layernorm_forward", out, mean, rstd, inp, nullptr, weight, bias);
}

absl::Status residual_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                        const Tensor& residual, const Tensor& weight, const Tensor& bias) {
  return residual_then_layernorm("residual_layernorm_forward", out, mean, rstd, inp, &residual, weight, bias);
}

absl::Status layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                const Tensor& dresidual) {
  const bool adds = given(dresidual);
  ZERO_RETURN_IF_ERROR(check_layernorm("layernorm_backward", inp, weight, mean, rstd,
                                       {{"dout", &dout}, {"dinp", &dinp}}, {{"dweight", &dweight}, {"dbias", &dbias}}));
  if (adds) {
    ZERO_RETURN_IF_ERROR(check_matrix("layernorm_backward", "dresidual", dresidual, inp.dtype(), inp.device(),
                                      detail::num_rows(inp), detail::last_dim(inp)));
  }
  if (inp.device().is_sim()) {
    std::vector<Access> accesses = {reads(dout), reads(inp),   reads(weight),   reads(mean),
                                    reads(rstd), writes(dinp), writes(dweight), writes(dbias)};
    if (adds) accesses.push_back(reads(dresidual));
    return launch_on_sim(inp.device(), "layernorm_backward", std::move(accesses), [=](HostTensors& host) {
      return layernorm_backward(host(dinp), host(dweight), host(dbias), host(dout), host(inp), host(weight), host(mean),
                                host(rstd), host(dresidual));
    });
  }
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::layernorm_backward(inp.device().index, dinp.data(), dweight.data(), dbias.data(), dout.data(),
                                    inp.data(), weight.data(), mean.data_as<float>(), rstd.data_as<float>(),
                                    dresidual.data(), inp.dtype(), detail::num_rows(inp), detail::last_dim(inp));
  }
#endif
  visit_floating(inp.dtype(), [&](auto t) {
    constexpr DType T = decltype(t)::value;
    backward_rows<T>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, dresidual.data_as<const StorageOf<T>>());
  });
  return absl::OkStatus();
}

}  // namespace zero::kernels
