// Token + position embedding: forward gathers rows, backward scatters into dwte/dwpe.
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
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

// tokens (B, T) int32 in [0, V); wte (V, C), wpe (maxT, C) with T <= maxT; `rows_c` (B, T, C) arguments.
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
  ZERO_RETURN_IF_ERROR(check_matrix(op, "wte", wte, DType::kF32, dev, d.vocab, d.c));
  ZERO_RETURN_IF_ERROR(check_matrix(op, "wpe", wpe, DType::kF32, dev, d.max_t, d.c));
  for (const auto& [name, t] : rows_c)
    ZERO_RETURN_IF_ERROR(check_matrix(op, name, *t, DType::kF32, dev, d.b * d.t, d.c));
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
    return cuda::embedding_forward(wte.device().index, out.data_as<float>(), tokens.data_as<int32_t>(),
                                   wte.data_as<float>(), wpe.data_as<float>(), d.b, d.t, d.c);
  }
#endif
  const int32_t* tok = d.host_tokens;
  for_blocks(d.b * d.t, kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* te = wte.data_as<float>() + tok[r] * d.c;
      const float* pe = wpe.data_as<float>() + (r % d.t) * d.c;
      float* o = out.data_as<float>() + r * d.c;
      for (int64_t i = 0; i < d.c; ++i) o[i] = te[i] + pe[i];
    }
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
    return cuda::embedding_backward(dwte.device().index, dwte.data_as<float>(), dwpe.data_as<float>(),
                                    dout.data_as<float>(), tokens.data_as<int32_t>(), d.b, d.t, d.c, d.vocab);
  }
#endif
  const int32_t* tok = d.host_tokens;
  const float* g = dout.data_as<float>();
  float* dte = dwte.data_as<float>();
  float* dpe = dwpe.data_as<float>();
  // Threads own column blocks; within a block, rows add in order, so repeated tokens sum deterministically.
  for_blocks(d.c, kColBlock, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < d.b * d.t; ++r) {
      const float* gr = g + r * d.c;
      float* te = dte + tok[r] * d.c;
      float* pe = dpe + (r % d.t) * d.c;
      for (int64_t i = c0; i < c1; ++i) {
        te[i] += gr[i];
        pe[i] += gr[i];
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace zero::kernels
