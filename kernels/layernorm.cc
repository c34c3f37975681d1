// LayerNorm over the last dim, forward (saving mean and rstd) and backward.
#include <cmath>

#include "kernels/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"
#include "runtime/status.h"

namespace zero::kernels {
namespace {

using detail::check_matrix;

constexpr int64_t kRowBlock = 16;

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

}  // namespace

absl::Status layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                               const Tensor& weight, const Tensor& bias) {
  ZERO_RETURN_IF_ERROR(
      check_layernorm("layernorm_forward", inp, weight, mean, rstd, {{"out", &out}}, {{"bias", &bias}}));
  const int64_t c = detail::last_dim(inp);
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::layernorm_forward(inp.device().index, out.data_as<float>(), mean.data_as<float>(),
                                   rstd.data_as<float>(), inp.data_as<float>(), weight.data_as<float>(),
                                   bias.data_as<float>(), detail::num_rows(inp), c);
  }
#endif
  const float* w = weight.data_as<float>();
  const float* b = bias.data_as<float>();
  detail::for_blocks(detail::num_rows(inp), kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = inp.data_as<float>() + r * c;
      float* y = out.data_as<float>() + r * c;
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

absl::Status layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  ZERO_RETURN_IF_ERROR(check_layernorm("layernorm_backward", inp, weight, mean, rstd,
                                       {{"dout", &dout}, {"dinp", &dinp}},
                                       {{"dweight", &dweight}, {"dbias", &dbias}}));
  const int64_t n = detail::num_rows(inp), c = detail::last_dim(inp);
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::layernorm_backward(inp.device().index, dinp.data_as<float>(), dweight.data_as<float>(),
                                    dbias.data_as<float>(), dout.data_as<float>(), inp.data_as<float>(),
                                    weight.data_as<float>(), mean.data_as<float>(), rstd.data_as<float>(), n, c);
  }
#endif
  const float* x = inp.data_as<float>();
  const float* g = dout.data_as<float>();
  const float* w = weight.data_as<float>();
  const float* mu = mean.data_as<float>();
  const float* rs = rstd.data_as<float>();
  auto xhat = [&](int64_t r, int64_t i) { return (x[r * c + i] - mu[r]) * rs[r]; };
  // dinp = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * weight, per row.
  detail::for_blocks(n, kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float dnorm_sum = 0.0f, dnorm_xhat_sum = 0.0f;
#pragma omp simd reduction(+ : dnorm_sum, dnorm_xhat_sum)
      for (int64_t i = 0; i < c; ++i) {
        const float dnorm = g[r * c + i] * w[i];
        dnorm_sum += dnorm;
        dnorm_xhat_sum += dnorm * xhat(r, i);
      }
      const float dnorm_mean = dnorm_sum / static_cast<float>(c);
      const float dnorm_xhat_mean = dnorm_xhat_sum / static_cast<float>(c);
      float* dx = dinp.data_as<float>() + r * c;
      for (int64_t i = 0; i < c; ++i) {
        dx[i] = (g[r * c + i] * w[i] - dnorm_mean - xhat(r, i) * dnorm_xhat_mean) * rs[r];
      }
    }
  });
  detail::add_column_sums(n, c, dweight.data_as<float>(), [&](int64_t r, int64_t i) { return g[r * c + i] * xhat(r, i); });
  detail::add_column_sums(n, c, dbias.data_as<float>(), [&](int64_t r, int64_t i) { return g[r * c + i]; });
  return absl::OkStatus();
}

}  // namespace zero::kernels
