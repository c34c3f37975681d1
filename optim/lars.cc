// LARS (You et al. 2017, Algorithm 1) with whole-parameter local learning rates from one allreduce per step.
#include <array>
#include <memory>

#include "absl/strings/str_cat.h"
#include "optim/cpu_loops.h"
#include "optim/optimizers.h"
#include "optim/trust_ratio.h"
#include "runtime/status.h"
#if ZERO_HAS_CUDA
#include "optim/cuda/optim_kernels.h"
#endif

namespace zero {
namespace {

class Lars final : public TrustRatioOptimizer {
 public:
  Lars(const LarsOptions& options, ShardLayout layout, Device device)
      : TrustRatioOptimizer(std::move(layout), device), options_(options) {}
  absl::string_view name() const override { return "LARS"; }

 private:
  absl::Status update(const StepArgs& a) override {
    ZERO_ASSIGN_OR_RETURN(const WholeParamNorms norms, whole_param_norms(a));
    std::vector<float> scaled_lr(norms.size());
    for (size_t i = 0; i < norms.size(); ++i) {
      const auto [p_norm, g_norm] = norms[i];
      const ParamGroup& group = layout().group_of(static_cast<int>(i));
      const double local_lr =
          p_norm > 0 && g_norm > 0 ? options_.trust_coefficient * p_norm / (g_norm + group.weight_decay * p_norm) : 1.0;
      scaled_lr[i] = static_cast<float>(a.lr * group.lr_scale * local_lr);
    }
    return apply(a, coeffs(), scaled_lr);
  }

  std::vector<optim::LarsCoeffs> coeffs() const {
    std::vector<optim::LarsCoeffs> coeffs;
    for (const ParamGroup& g : layout().groups()) {
      coeffs.push_back({static_cast<float>(options_.momentum), g.weight_decay});
    }
    return coeffs;
  }

  // Pass 1: the sums of p² and g², which the host reads once the launch ran (waited for under `wait`; on CUDA the
  // reader waits for the bins' copy back itself).
  absl::StatusOr<ChunkSumsReader> chunk_square_sums(const StepArgs& a, bool wait) override {
#if ZERO_HAS_CUDA
    if (device().is_cuda()) return optim::lars_sums_cuda(device().index, layout(), coeffs(), a, bins_);
#endif
    return cpu_norm_pass(
        "lars square sums", a, Use::kNone,
        [](const ShardLayout&, const StepArgs& s, const std::vector<float*>&, const ShardChunk&) {
          return [p = static_cast<const float*>(s.params)](int64_t i, float g, SquareBins& p_sq, SquareBins& g_sq) {
            p_sq.add(p[i]);
            g_sq.add(g);
          };
        },
        wait);
  }

  absl::Status apply(const StepArgs& a, const std::vector<optim::LarsCoeffs>& coeffs,
                     const std::vector<float>& scaled_lr) {
#if ZERO_HAS_CUDA
    if (device().is_cuda()) {
      return optim::lars_apply_cuda(device().index, layout(), coeffs, scaled_lr, a, state_data(0));
    }
#endif
    return run_cpu_pass(
        "lars apply", a, {},
        [coeffs, scaled_lr](const ShardLayout& layout, const StepArgs& s, const std::vector<float*>& state) {
          float* __restrict v = state[0];
          float* __restrict p = s.params;
          optim::update_chunks(layout, *s.half, s.params, s.step, [&](int64_t, const ShardChunk& ch) {
            const optim::LarsCoeffs c = coeffs[layout.params()[ch.param].group];
            const float lr = scaled_lr[ch.param];
            optim::for_each_gradient_piece(s.grads, ch, [&](const float* __restrict g, int64_t b, int64_t e) {
              for (int64_t i = b; i < e; ++i) {
                p[i] = optim::lars_element(p[i], g[i - b], v[i], c.momentum, lr, c.weight_decay);
              }
            });
          });
          return absl::OkStatus();
        });
  }

  LarsOptions options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> make_lars(const LarsOptions& options, ShardLayout layout,
                                                     Allocator& allocator, Device device) {
  if (!(options.momentum >= 0 && options.trust_coefficient > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("LARS momentum ", options.momentum, " and trust coefficient ",
                                                   options.trust_coefficient,
                                                   ": need momentum >= 0 and a positive "
                                                   "trust coefficient"));
  }
  ZERO_RETURN_IF_ERROR(optim::check_device(device, "LARS", /*has_cuda_kernel=*/true));
  auto opt = std::make_unique<Lars>(options, std::move(layout), device);
  ZERO_RETURN_IF_ERROR(opt->allocate_state(allocator, {"momentum_buffer"}));
  ZERO_RETURN_IF_ERROR(opt->allocate_bins(allocator));
  return opt;
}

}  // namespace zero
