// Causal multi-head self-attention on the CPU: one (batch, head) per task, its products as single-threaded GEMMs;
// bf16/fp16 tensors widened, and the results rounded once (kernels/widened.h).
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/blas.h"
#include "kernels/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/fast_math.h"
#include "kernels/kernels.h"
#include "kernels/widened.h"
#include "runtime/parallel.h"
#include "runtime/sim/sim_api.h"
#include "runtime/status.h"

namespace zero::kernels {
namespace {

using detail::check_matrix;

struct AttentionDims {
  int64_t b = 0, t = 0, c = 0, nh = 0, hs = 0;
};

absl::StatusOr<AttentionDims> check_attention(absl::string_view op, const Tensor& inp, const Tensor& lse,
                                              int64_t num_heads,
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
  ZERO_RETURN_IF_ERROR(detail::check_floating(op, "inp", inp));
  ZERO_RETURN_IF_ERROR(detail::check_numel(op, "lse", lse, DType::kF32, dev, b * num_heads * t));
  for (const auto& [name, x] : rows_c) ZERO_RETURN_IF_ERROR(check_matrix(op, name, *x, inp.dtype(), dev, b * t, d.c));
  for (const auto& [name, x] : rows_3c) ZERO_RETURN_IF_ERROR(check_matrix(op, name, *x, inp.dtype(), dev, b * t, c3));
  if (dev.is_cuda() && d.hs > cuda::kMaxHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": head size ", d.hs, " exceeds the CUDA kernel's ", cuda::kMaxHeadDim));
  }
  return d;
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
  for_blocks(d.b * d.nh, 1, [&](int64_t i, int64_t) { fn(i / d.nh, i % d.nh); });
}

// C (m, n) = op(A) op(B) for row-major operands with row strides lda, ldb, ldc, on the calling thread.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
          int64_t ldb, float* c, int64_t ldc) {
  detail::tiled_sgemm({.trans_a = trans_a,
                       .trans_b = trans_b,
                       .m = m,
                       .n = n,
                       .k = k,
                       .a = a,
                       .lda = lda,
                       .b = b,
                       .ldb = ldb,
                       .c = c,
                       .ldc = ldc});
}

// p (T, T) = exp(scale q k^T - lse) with the future (j > i) zeroed: softmax rows, given each row's lse.
void causal_probabilities(const HeadView& hv, const AttentionDims& d, float scale, const float* row_lse, float* p) {
  gemm(false, true, d.t, d.t, d.hs, hv.q, hv.stride, hv.k, hv.stride, p, d.t);
  for (int64_t i = 0; i < d.t; ++i) {
    float* row = p + i * d.t;
    for (int64_t j = 0; j <= i; ++j) row[j] = detail::exp_poly(scale * row[j] - row_lse[i]);
    std::fill(row + i + 1, row + d.t, 0.0f);
  }
}

}  // namespace

absl::Status attention_forward(const Tensor& out, const Tensor& lse, const Tensor& inp, int64_t num_heads) {
  ZERO_ASSIGN_OR_RETURN(const AttentionDims d,
                        check_attention("attention_forward", inp, lse, num_heads, {{"out", &out}}, {}));
  if (inp.device().is_sim()) {
    return launch_on_sim(
        inp.device(), "attention_forward", {reads(inp), writes(out), writes(lse)},
        [=](HostTensors& host) { return attention_forward(host(out), host(lse), host(inp), num_heads); });
  }
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::attention_forward(inp.device().index, out.data(), lse.data_as<float>(), inp.data(), inp.dtype(), d.b,
                                   d.t, d.nh, d.hs);
  }
#endif
  if (inp.dtype() != DType::kF32) {
    using enum detail::Role;
    return detail::on_widened({{out, kOut}, {lse, kOut}, {inp, kIn}},
                              [=](const auto& t) { return attention_forward(t[0], t[1], t[2], num_heads); });
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));
  for_each_head(d, [&](int64_t b, int64_t h) {
    const HeadView hv = head_view(inp.data_as<float>(), d, b, h);
    float* row_lse = lse.data_as<float>() + (b * d.nh + h) * d.t;
    std::vector<float> p(static_cast<size_t>(d.t * d.t));  // (T, T) q k^T, then exp(scale s - max) per row
    gemm(false, true, d.t, d.t, d.hs, hv.q, hv.stride, hv.k, hv.stride, p.data(), d.t);
    std::vector<double> sums(static_cast<size_t>(d.t));
    for (int64_t i = 0; i < d.t; ++i) {
      float* row = p.data() + i * d.t;
      float max = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) max = std::fmax(max, row[j] *= scale);
      for (int64_t j = 0; j <= i; ++j) row[j] = detail::exp_poly(row[j] - max);
      const double sum = detail::sum_fp64(row, i + 1);
      std::fill(row + i + 1, row + d.t, 0.0f);
      sums[i] = sum;
      row_lse[i] = max + static_cast<float>(std::log(sum));
    }
    // out (T, hs) = p v, then each row divided by its sum.
    float* o = out.data_as<float>() + b * d.t * d.c + h * d.hs;
    gemm(false, false, d.t, d.hs, d.t, p.data(), d.t, hv.v, hv.stride, o, d.c);
    for (int64_t i = 0; i < d.t; ++i) {
      const float inv = static_cast<float>(1.0 / sums[i]);
      for (int64_t e = 0; e < d.hs; ++e) o[i * d.c + e] *= inv;
    }
  });
  return absl::OkStatus();
}

// With P = softmax(S), S = scale q k^T (causal), O = P v and D_i = dO_i · O_i:
// dv_j = sum_i P_ij dO_i;  dS_ij = P_ij (dO_i · v_j - D_i);  dq_i = scale sum_j dS_ij k_j;  dk_j = scale sum_i dS_ij
// q_i.
absl::Status attention_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp, const Tensor& out,
                                const Tensor& lse, int64_t num_heads) {
  ZERO_ASSIGN_OR_RETURN(const AttentionDims d, check_attention("attention_backward", inp, lse, num_heads,
                                                               {{"dout", &dout}, {"out", &out}}, {{"dinp", &dinp}}));
  if (inp.device().is_sim()) {
    return launch_on_sim(inp.device(), "attention_backward",
                         {reads(dout), reads(inp), reads(out), reads(lse), writes(dinp)}, [=](HostTensors& host) {
                           return attention_backward(host(dinp), host(dout), host(inp), host(out), host(lse),
                                                     num_heads);
                         });
  }
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::attention_backward(inp.device().index, dinp.data(), dout.data(), inp.data(), out.data(),
                                    lse.data_as<float>(), inp.dtype(), d.b, d.t, d.nh, d.hs);
  }
#endif
  if (inp.dtype() != DType::kF32) {
    using enum detail::Role;
    return detail::on_widened({{dinp, kOut}, {dout, kIn}, {inp, kIn}, {out, kIn}, {lse, kIn}}, [=](const auto& t) {
      return attention_backward(t[0], t[1], t[2], t[3], t[4], num_heads);
    });
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));
  for_each_head(d, [&](int64_t b, int64_t h) {
    const HeadView hv = head_view(inp.data_as<float>(), d, b, h);
    float* dq = dinp.data_as<float>() + b * d.t * 3 * d.c + h * d.hs;
    float* dk = dq + d.c;
    float* dv = dq + 2 * d.c;
    const float* d_o = dout.data_as<float>() + b * d.t * d.c + h * d.hs;  // (T, hs), row stride C
    const float* o = out.data_as<float>() + b * d.t * d.c + h * d.hs;
    std::vector<float> p(static_cast<size_t>(d.t * d.t)), ds(static_cast<size_t>(d.t * d.t));  // (T, T) each
    causal_probabilities(hv, d, scale, lse.data_as<float>() + (b * d.nh + h) * d.t, p.data());
    gemm(true, false, d.t, d.hs, d.t, p.data(), d.t, d_o, d.c, dv, hv.stride);     // dv = p^T dO
    gemm(false, true, d.t, d.t, d.hs, d_o, d.c, hv.v, hv.stride, ds.data(), d.t);  // dP = dO v^T
    for (int64_t i = 0; i < d.t; ++i) {
      float di = 0.0f;  // dO_i . O_i
      for (int64_t e = 0; e < d.hs; ++e) di += d_o[i * d.c + e] * o[i * d.c + e];
      float* row = ds.data() + i * d.t;
      const float* pi = p.data() + i * d.t;
      for (int64_t j = 0; j < d.t; ++j) row[j] = pi[j] * (row[j] - di) * scale;  // 0 where p is (the future)
    }
    gemm(false, false, d.t, d.hs, d.t, ds.data(), d.t, hv.k, hv.stride, dq, hv.stride);  // dq = dS k
    gemm(true, false, d.t, d.hs, d.t, ds.data(), d.t, hv.q, hv.stride, dk, hv.stride);   // dk = dS^T q
  });
  return absl::OkStatus();
}

}  // namespace zero::kernels
