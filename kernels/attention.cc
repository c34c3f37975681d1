// Causal multi-head self-attention on the CPU: one (batch, head) per task, one query row at a time.
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"
#include "runtime/status.h"

namespace zero::kernels {
namespace {

using detail::check_matrix;

struct AttentionDims {
  int64_t b = 0, t = 0, c = 0, nh = 0, hs = 0;
};

absl::StatusOr<AttentionDims> check_attention(
    absl::string_view op, const Tensor& inp, const Tensor& lse, int64_t num_heads,
    std::initializer_list<std::pair<const char*, const Tensor*>> rows_c,
    std::initializer_list<std::pair<const char*, const Tensor*>> rows_3c) {
  ZERO_RETURN_IF_ERROR(detail::check_dims(op, "inp", inp, 3));
  const int64_t b = inp.size(0), t = inp.size(1), c3 = inp.size(2);
  if (num_heads < 1 || c3 % (3 * num_heads) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": inp's last dim ", c3, " is not 3 * C with C a multiple of num_heads ", num_heads));
  }
  const AttentionDims d{b, t, c3 / 3, num_heads, c3 / 3 / num_heads};
  const Device dev = inp.device();
  ZERO_RETURN_IF_ERROR(check_matrix(op, "inp", inp, DType::kF32, dev, b * t, c3));
  ZERO_RETURN_IF_ERROR(detail::check_numel(op, "lse", lse, DType::kF32, dev, b * num_heads * t));
  for (const auto& [name, x] : rows_c) ZERO_RETURN_IF_ERROR(check_matrix(op, name, *x, DType::kF32, dev, b * t, d.c));
  for (const auto& [name, x] : rows_3c) ZERO_RETURN_IF_ERROR(check_matrix(op, name, *x, DType::kF32, dev, b * t, c3));
  ZERO_RETURN_IF_ERROR(detail::check_backend(op, dev));
  if (dev.is_cuda() && d.hs > cuda::kMaxHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": head size ", d.hs, " exceeds the CUDA kernel's ", cuda::kMaxHeadDim));
  }
  return d;
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += a * x over n elements.
void axpy(float a, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// Pointers to one (batch, head)'s rows: q/k/v row t at q + t * stride (and k, v), out likewise.
struct HeadView {
  const float* q;
  const float* k;
  const float* v;
  int64_t stride;  // 3C
};

HeadView head_view(const float* inp, const AttentionDims& d, int64_t b, int64_t h) {
  const float* base = inp + b * d.t * 3 * d.c + h * d.hs;
  return {base, base + d.c, base + 2 * d.c, 3 * d.c};
}

// fn(b, h) for every (batch, head), split statically over the threads; each task owns its rows.
template <typename Fn>
void for_each_head(const AttentionDims& d, Fn&& fn) {
  detail::for_blocks(d.b * d.nh, 1, [&](int64_t i, int64_t) { fn(i / d.nh, i % d.nh); });
}

}  // namespace

absl::Status attention_forward(const Tensor& out, const Tensor& lse, const Tensor& inp, int64_t num_heads) {
  ZERO_ASSIGN_OR_RETURN(const AttentionDims d,
                        check_attention("attention_forward", inp, lse, num_heads, {{"out", &out}}, {}));
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::attention_forward(inp.device().index, out.data_as<float>(), lse.data_as<float>(),
                                   inp.data_as<float>(), d.b, d.t, d.nh, d.hs);
  }
#endif
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));
  for_each_head(d, [&](int64_t b, int64_t h) {
    const HeadView hv = head_view(inp.data_as<float>(), d, b, h);
    std::vector<float> p(static_cast<size_t>(d.t));  // (T) the current query's scores, then exp(score - max)
    for (int64_t i = 0; i < d.t; ++i) {
      const float* qi = hv.q + i * hv.stride;
      float max = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        p[j] = scale * dot(qi, hv.k + j * hv.stride, d.hs);
        max = std::fmax(max, p[j]);
      }
      float* oi = out.data_as<float>() + (b * d.t + i) * d.c + h * d.hs;
      std::fill(oi, oi + d.hs, 0.0f);
      double sum = 0.0;
      for (int64_t j = 0; j <= i; ++j) {
        p[j] = std::exp(p[j] - max);
        sum += p[j];
        axpy(p[j], hv.v + j * hv.stride, oi, d.hs);
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t e = 0; e < d.hs; ++e) oi[e] *= inv;
      lse.data_as<float>()[(b * d.nh + h) * d.t + i] = max + static_cast<float>(std::log(sum));
    }
  });
  return absl::OkStatus();
}

// With P = softmax(S), S = scale q k^T (causal), O = P v and D_i = dO_i · O_i:
// dv_j = sum_i P_ij dO_i;  dS_ij = P_ij (dO_i · v_j - D_i);  dq_i = scale sum_j dS_ij k_j;  dk_j = scale sum_i dS_ij q_i.
absl::Status attention_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp, const Tensor& out,
                                const Tensor& lse, int64_t num_heads) {
  ZERO_ASSIGN_OR_RETURN(const AttentionDims d,
                        check_attention("attention_backward", inp, lse, num_heads,
                                        {{"dout", &dout}, {"out", &out}}, {{"dinp", &dinp}}));
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::attention_backward(inp.device().index, dinp.data_as<float>(), dout.data_as<float>(),
                                    inp.data_as<float>(), out.data_as<float>(), lse.data_as<float>(), d.b, d.t, d.nh,
                                    d.hs);
  }
#endif
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));
  for_each_head(d, [&](int64_t b, int64_t h) {
    const HeadView hv = head_view(inp.data_as<float>(), d, b, h);
    float* dq = dinp.data_as<float>() + b * d.t * 3 * d.c + h * d.hs;
    float* dk = dq + d.c;
    float* dv = dq + 2 * d.c;
    for (int64_t j = 0; j < d.t; ++j) {
      std::fill(dk + j * hv.stride, dk + j * hv.stride + d.hs, 0.0f);
      std::fill(dv + j * hv.stride, dv + j * hv.stride + d.hs, 0.0f);
    }
    const float* row_lse = lse.data_as<float>() + (b * d.nh + h) * d.t;
    for (int64_t i = 0; i < d.t; ++i) {
      const float* qi = hv.q + i * hv.stride;
      const float* doi = dout.data_as<float>() + (b * d.t + i) * d.c + h * d.hs;
      const float* oi = out.data_as<float>() + (b * d.t + i) * d.c + h * d.hs;
      float* dqi = dq + i * hv.stride;
      std::fill(dqi, dqi + d.hs, 0.0f);
      const float di = dot(doi, oi, d.hs);
      for (int64_t j = 0; j <= i; ++j) {
        const float* kj = hv.k + j * hv.stride;
        const float pij = std::exp(scale * dot(qi, kj, d.hs) - row_lse[i]);
        const float dsij = pij * (dot(doi, hv.v + j * hv.stride, d.hs) - di) * scale;
        axpy(pij, doi, dv + j * hv.stride, d.hs);
        axpy(dsij, qi, dk + j * hv.stride, d.hs);
        axpy(dsij, kj, dqi, d.hs);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace zero::kernels
