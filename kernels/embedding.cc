// Token + position embedding in fp32, bf16 or fp16: forward gathers rows, backward adds each token's rows into dwte
// and each position's into dwpe.
#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
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

constexpr int64_t kRowBlock = 16;
constexpr int64_t kColBlock = 64;

struct EmbeddingDims {
  int64_t b = 0, t = 0, c = 0, vocab = 0, max_t = 0;
  const int32_t* host_tokens = nullptr;  // tokens' data, or their copy on the host for device tensors
};

// tokens (B, T) int32 in [0, V); wte (V, C), wpe (maxT, C) with T <= maxT; `rows_c` (B, T, C) arguments; every float
// tensor in wte's dtype (fp32, bf16 or fp16).
// `host_copy` holds the tokens read back from a CUDA or simulated device when `host_tokens` is empty.
absl::StatusOr<EmbeddingDims> check_embedding(absl::string_view op, const Tensor& tokens, const Tensor& wte,
                                              const Tensor& wpe,
                                              std::initializer_list<std::pair<const char*, const Tensor*>> rows_c,
                                              const Tensor& host_tokens, std::vector<int32_t>& host_copy) {
  ZERO_RETURN_IF_ERROR(detail::check_dims(op, "tokens", tokens, 2));
  ZERO_RETURN_IF_ERROR(detail::check_dims(op, "wte", wte, 2));
  ZERO_RETURN_IF_ERROR(detail::check_dims(op, "wpe", wpe, 2));
  EmbeddingDims d{tokens.size(0), tokens.size(1), wte.size(1), wte.size(0), wpe.size(0)};
  const Device dev = wte.device();
  ZERO_RETURN_IF_ERROR(check_matrix(op, "tokens", tokens, DType::kI32, dev, d.b, d.t));
  ZERO_RETURN_IF_ERROR(detail::check_floating(op, "wte", wte));
  ZERO_RETURN_IF_ERROR(check_matrix(op, "wte", wte, wte.dtype(), dev, d.vocab, d.c));
  ZERO_RETURN_IF_ERROR(check_matrix(op, "wpe", wpe, wte.dtype(), dev, d.max_t, d.c));
  for (const auto& [name, t] : rows_c)
    ZERO_RETURN_IF_ERROR(check_matrix(op, name, *t, wte.dtype(), dev, d.b * d.t, d.c));
  ZERO_RETURN_IF_ERROR(detail::check_backend(op, dev));
  if (d.t > d.max_t) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": sequence length ", d.t, " exceeds wpe's ", d.max_t, " positions"));
  }
  ZERO_ASSIGN_OR_RETURN(d.host_tokens, int32_on_host(tokens, host_tokens, host_copy));
  const int32_t* tok = d.host_tokens;
  for (int64_t i = 0; i < d.b * d.t; ++i) {
    if (tok[i] < 0 || tok[i] >= d.vocab) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": token ", tok[i], " at ", i, " outside [0, ", d.vocab, ")"));
    }
  }
  return d;
}

}  // namespace

absl::Status embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                               const Tensor& host_tokens) {
  std::vector<int32_t> host_copy;
  ZERO_ASSIGN_OR_RETURN(const EmbeddingDims d, check_embedding("embedding_forward", tokens, wte, wpe, {{"out", &out}},
                                                               host_tokens, host_copy));
  if (wte.device().is_sim()) {  // the tokens were checked on the host above, as for CUDA
    return launch_on_sim(
        wte.device(), "embedding_forward", {reads(tokens), reads(wte), reads(wpe), writes(out)},
        [=](HostTensors& host) { return embedding_forward(host(out), host(tokens), host(wte), host(wpe)); });
  }
#if ZERO_HAS_CUDA
  if (wte.device().is_cuda()) {
    return cuda::embedding_forward(wte.device().index, out.data(), tokens.data_as<int32_t>(), wte.data(), wpe.data(),
                                   wte.dtype(), d.b, d.t, d.c);
  }
#endif
  visit_floating(wte.dtype(), [&](auto type) {
    constexpr DType T = decltype(type)::value;
    const int32_t* tok = d.host_tokens;
    for_blocks(d.b * d.t, kRowBlock, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t te = tok[r] * d.c, pe = (r % d.t) * d.c, o = r * d.c;
        for (int64_t i = 0; i < d.c; ++i) {
          store_from_float(out.data(), T, o + i,
                           load_as_float(wte.data(), T, te + i) + load_as_float(wpe.data(), T, pe + i));
        }
      }
    });
  });
  return absl::OkStatus();
}

absl::Status embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                                const Tensor& host_tokens) {
  std::vector<int32_t> host_copy;
  ZERO_ASSIGN_OR_RETURN(const EmbeddingDims d, check_embedding("embedding_backward", tokens, dwte, dwpe,
                                                               {{"dout", &dout}}, host_tokens, host_copy));
  if (dwte.device().is_sim()) {
    return launch_on_sim(
        dwte.device(), "embedding_backward", {reads(dout), reads(tokens), writes(dwte), writes(dwpe)},
        [=](HostTensors& host) { return embedding_backward(host(dwte), host(dwpe), host(dout), host(tokens)); });
  }
#if ZERO_HAS_CUDA
  if (dwte.device().is_cuda()) {
    return cuda::embedding_backward(dwte.device().index, dwte.data(), dwpe.data(), dout.data(),
                                    tokens.data_as<int32_t>(), dwte.dtype(), d.b, d.t, d.c, d.vocab);
  }
#endif
  // The rows sorted by token, stably: each token's rows are a run, in increasing row order.
  const int32_t* tok = d.host_tokens;
  std::vector<int64_t> rows(static_cast<size_t>(d.b * d.t));
  std::iota(rows.begin(), rows.end(), 0);
  std::stable_sort(rows.begin(), rows.end(), [tok](int64_t x, int64_t y) { return tok[x] < tok[y]; });
  visit_floating(dwte.dtype(), [&](auto type) {
    constexpr DType T = decltype(type)::value;
    const void* g = dout.data();
    // dst row dst_row, columns [c0, c1) += the dout rows src_row(0), src_row(1), ... in that order, in fp32 in `acc`
    // (a row of the column block: the adds vectorize across columns), then rounded once.
    const auto add_rows = [&](void* dst, int64_t dst_row, auto src_row, int64_t count, int64_t c0, int64_t c1) {
      float acc[kColBlock];
      const int64_t width = c1 - c0, first = dst_row * d.c + c0;
      for (int64_t i = 0; i < width; ++i) acc[i] = load_as_float(dst, T, first + i);
      for (int64_t k = 0; k < count; ++k) {
        const int64_t row = src_row(k) * d.c + c0;
        for (int64_t i = 0; i < width; ++i) acc[i] += load_as_float(g, T, row + i);
      }
      for (int64_t i = 0; i < width; ++i) store_from_float(dst, T, first + i, acc[i]);
    };
    // Threads own column blocks. Each token's run, and each position's rows (b = 0, 1, ...), are added in row
    // order in fp32 and rounded once.
    for_blocks(d.c, kColBlock, [&](int64_t c0, int64_t c1) {
      for (size_t start = 0, end; start < rows.size(); start = end) {
        end = start + 1;
        while (end < rows.size() && tok[rows[end]] == tok[rows[start]]) ++end;
        add_rows(
            dwte.data(), tok[rows[start]], [&](int64_t k) { return rows[start + k]; },
            static_cast<int64_t>(end - start), c0, c1);
      }
      for (int64_t t = 0; t < d.t; ++t)
        add_rows(
            dwpe.data(), t, [&](int64_t k) { return k * d.t + t; }, d.b, c0, c1);
    });
  });
  return absl::OkStatus();
}

}  // namespace zero::kernels
