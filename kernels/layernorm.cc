// LayerNorm over the last dim, forward (saving mean and rstd) and backward.
#include <cmath>
#include <vector>

#include "kernels/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
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

// inp (N, C) fixes N and C; weight (C); mean, rstd (N); every other (N, C) argument is checked here too.
absl::Status check_layernorm(absl::string_view op, const Tensor& inp, const Tensor& weight, const Tensor& mean,
                             const Tensor& rstd, std::initializer_list<std::pair<const char*, const Tensor*>> rows_c,
                             std::initializer_list<std::pair<const char*, const Tensor*>> vectors_c) {
  const int64_t n = detail::num_rows(inp), c = detail::last_dim(inp);
  const Device dev = inp.device();
  ZERO_RETURN_IF_ERROR(check_matrix(op, "inp", inp, DType::kF32, dev, n, c));
  ZERO_RETURN_IF_ERROR(check_matrix(op, "weight", weight, DType::kF32, dev, 1, c));
  ZERO_RETURN_IF_ERROR(detail::check_numel(op, "mean", mean, DType::kF32, dev, n));
  ZERO_RETURN_IF_ERROR(detail::check_numel(op, "rstd", rstd, DType::kF32, dev, n));
  for (const auto& [name, t] : rows_c) ZERO_RETURN_IF_ERROR(check_matrix(op, name, *t, DType::kF32, dev, n, c));
  for (const auto& [name, t] : vectors_c) ZERO_RETURN_IF_ERROR(check_matrix(op, name, *t, DType::kF32, dev, 1, c));
  return detail::check_backend(op, dev);
}

constexpr int kLanes = 8;

// The lanes added pairwise: ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)).
float pairwise_total(const float (&lanes)[kLanes]) {
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// One row of backward (C columns; xhat = (inp - mean) * rstd): writes dinp and adds dout * xhat and dout to the
// fp64 column sums acc_dweight and acc_dbias. The row's sums of dnorm = dout * weight and dnorm * xhat run in kLanes
// interleaved fp32 partial sums (element i into lane i % kLanes) added pairwise: a fixed order that vectorizes.
void row_backward(float* dx, double* acc_dweight, double* acc_dbias, const float* g, const float* x, const float* w,
                  float mean, float rstd, int64_t c) {
  float dnorm_lanes[kLanes] = {}, dnorm_xhat_lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= c; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const float dnorm = g[i + k] * w[i + k];
      dnorm_lanes[k] += dnorm;
      dnorm_xhat_lanes[k] += dnorm * ((x[i + k] - mean) * rstd);
    }
  }
  for (; i < c; ++i) {
    const float dnorm = g[i] * w[i];
    dnorm_lanes[i % kLanes] += dnorm;
    dnorm_xhat_lanes[i % kLanes] += dnorm * ((x[i] - mean) * rstd);
  }
  const float dnorm_mean = pairwise_total(dnorm_lanes) / static_cast<float>(c);
  const float dnorm_xhat_mean = pairwise_total(dnorm_xhat_lanes) / static_cast<float>(c);
  for (i = 0; i < c; ++i) {
    const float xhat = (x[i] - mean) * rstd;
    dx[i] = (g[i] * w[i] - dnorm_mean - xhat * dnorm_xhat_mean) * rstd;
    acc_dweight[i] += g[i] * xhat;
    acc_dbias[i] += g[i];
  }
}

// layernorm_forward, after inp += *residual where one is passed (residual_layernorm_forward).
absl::Status residual_then_layernorm(absl::string_view op, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& inp, const Tensor* residual, const Tensor& weight,
                                     const Tensor& bias) {
  const bool adds = residual != nullptr;
  ZERO_RETURN_IF_ERROR(check_layernorm(op, inp, weight, mean, rstd, {{"out", &out}}, {{"bias", &bias}}));
  if (adds) {
    ZERO_RETURN_IF_ERROR(check_matrix(op, "residual", *residual, DType::kF32, inp.device(), detail::num_rows(inp),
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
  const int64_t c = detail::last_dim(inp);
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::layernorm_forward(inp.device().index, out.data_as<float>(), mean.data_as<float>(),
                                   rstd.data_as<float>(), inp.data_as<float>(),
                                   adds ? residual->data_as<float>() : nullptr, weight.data_as<float>(),
                                   bias.data_as<float>(), detail::num_rows(inp), c);
  }
#endif
  const float* w = weight.data_as<float>();
  const float* b = bias.data_as<float>();
  for_blocks(detail::num_rows(inp), kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* x = inp.data_as<float>() + r * c;
      float* y = out.data_as<float>() + r * c;
      if (adds) {
        const float* res = residual->data_as<float>() + r * c;
        for (int64_t i = 0; i < c; ++i) x[i] += res[i];
      }
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < c; ++i) sum += x[i];
      const float m = sum / static_cast<float>(c);
      float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
      for (int64_t i = 0; i < c; ++i) sq += (x[i] - m) * (x[i] - m);
      const float s = 1.0f / std::sqrt(sq / static_cast<float>(c) + kLayerNormEps);
      for (int64_t i = 0; i < c; ++i) y[i] = (x[i] - m) * s * w[i] + b[i];
      mean.data_as<float>()[r] = m;
      rstd.data_as<float>()[r] = s;
    }
  });
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
    ZERO_RETURN_IF_ERROR(check_matrix("layernorm_backward", "dresidual", dresidual, DType::kF32, inp.device(),
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
  const int64_t n = detail::num_rows(inp), c = detail::last_dim(inp);
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::layernorm_backward(inp.device().index, dinp.data_as<float>(), dweight.data_as<float>(),
                                    dbias.data_as<float>(), dout.data_as<float>(), inp.data_as<float>(),
                                    weight.data_as<float>(), mean.data_as<float>(), rstd.data_as<float>(),
                                    dresidual.data_as<float>(), n, c);
  }
#endif
  const float* x = inp.data_as<float>();
  const float* g = dout.data_as<float>();
  const float* w = weight.data_as<float>();
  const float* mu = mean.data_as<float>();
  const float* rs = rstd.data_as<float>();
  float* dx = dinp.data_as<float>();
  const float* dres = dresidual.data_as<float>();  // null: none
  // dinp = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * weight, per row; dweight and
  // dbias from the same pass: fp64 column sums per block of kParamRows rows (in row order), then the blocks in order.
  const int64_t blocks = ceil_div(n, kParamRows);
  std::vector<double> partial(static_cast<size_t>(blocks * 2 * c), 0.0);  // per block: dweight's c, then dbias's c
  for_blocks(n, kParamRows, [=, &partial](int64_t r0, int64_t r1) {
    double* acc = partial.data() + r0 / kParamRows * 2 * c;
    for (int64_t r = r0; r < r1; ++r) {
      row_backward(dx + r * c, acc, acc + c, g + r * c, x + r * c, w, mu[r], rs[r], c);
      if (dres != nullptr) {
        for (int64_t i = r * c; i < (r + 1) * c; ++i) dx[i] += dres[i];  // as residual_backward, after
      }
    }
  });
  float* dw = dweight.data_as<float>();
  float* db = dbias.data_as<float>();
  for_blocks(c, kParamCols, [&](int64_t c0, int64_t c1) {
    for (int64_t i = c0; i < c1; ++i) {
      double sum_dweight = 0, sum_dbias = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        sum_dweight += partial[(b * 2) * c + i];
        sum_dbias += partial[(b * 2 + 1) * c + i];
      }
      dw[i] += static_cast<float>(sum_dweight);
      db[i] += static_cast<float>(sum_dbias);
    }
  });
  return absl::OkStatus();
}

}  // namespace zero::kernels
