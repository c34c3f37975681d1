// LAMB (You et al. 2019, Algorithm 2) with whole-parameter trust ratios from one allreduce per step.
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "optim/adam_coeffs.h"
#include "optim/cpu_loops.h"
#include "optim/optimizers.h"
#include "optim/trust_ratio.h"
#include "runtime/status.h"
#if ZERO_HAS_CUDA
#include "optim/cuda/optim_kernels.h"
#endif

namespace zero {
namespace {

class Lamb final : public TrustRatioOptimizer {
 public:
  Lamb(const LambOptions& options, ShardLayout layout, Device device)
      : TrustRatioOptimizer(std::move(layout), device), options_(options) {}
  absl::string_view name() const override { return "LAMB"; }

 private:
  // Pass 1 updates the moments and sums ||p||^2 and ||u||^2 exactly; after the allreduce, pass 2
  // recomputes u from the same inputs (so the same bits) and applies it scaled by the trust ratio.
  absl::Status update(const StepArgs& a) override {
    ZERO_ASSIGN_OR_RETURN(const WholeParamNorms norms, whole_param_norms(a));
    const double lr = a.lr * step_size_factor(a.step);
    std::vector<float> neg_step(norms.size());
    for (size_t i = 0; i < norms.size(); ++i) {
      const double ratio = trust_ratio(norms[i][0], norms[i][1]);
      neg_step[i] = static_cast<float>(-(lr * layout().group_of(static_cast<int>(i)).lr_scale * ratio));
    }
    return apply(a, coeffs(a), neg_step);
  }

  std::vector<optim::LambCoeffs> coeffs(const StepArgs& a) const {
    std::vector<optim::LambCoeffs> coeffs;
    for (const ParamGroup& g : layout().groups()) {
      // Weight decay enters through u, not through Adam's l2 or decoupled decay.
      optim::AdamCoeffs adam = optim::adam_coeffs(options_.beta1, options_.beta2, options_.eps, /*decoupled=*/true, a,
                                                  ParamGroup{g.lr_scale, 0.0f});
      if (options_.bias_correction != LambBiasCorrection::kMoments) {
        adam.bias_correction1 = adam.bias_correction2 = 1.0f;  // u from the raw moments
      }
      coeffs.push_back({adam, g.weight_decay});
    }
    return coeffs;
  }

  // ||p|| / ||u||, clamped to the options' range; 1 when either norm is 0 (a fresh or a still parameter).
  double trust_ratio(double p_norm, double u_norm) const {
    if (p_norm == 0 || u_norm == 0) return 1.0;
    return std::clamp(p_norm / u_norm, options_.min_trust_ratio, options_.max_trust_ratio);
  }

  // FusedLamb's bias correction, applied to the step after the trust ratio (which would cancel it in u).
  double step_size_factor(int64_t step) const {
    if (options_.bias_correction != LambBiasCorrection::kStepSize) return 1.0;
    const double t = static_cast<double>(step);
    return std::sqrt(1.0 - std::pow(options_.beta2, t)) / (1.0 - std::pow(options_.beta1, t));
  }

  // Pass 1: the moments, and the sums of p² and u², which the host reads once the launch ran (waited for under `wait`;
  // on CUDA the reader waits for the bins' copy back itself).
  absl::StatusOr<ChunkSumsReader> chunk_square_sums(const StepArgs& a, bool wait) override {
    const std::vector<optim::LambCoeffs> coeffs = this->coeffs(a);
#if ZERO_HAS_CUDA
    if (device().is_cuda()) {
      return optim::lamb_sums_cuda(device().index, layout(), coeffs, a, state_data(0), state_data(1), bins_);
    }
#endif
    return cpu_norm_pass(
        "lamb square sums", a, Use::kWrite,
        [coeffs](const ShardLayout& layout, const StepArgs& s, const std::vector<float*>& state, const ShardChunk& ch) {
          const optim::LambCoeffs c = coeffs[layout.params()[ch.param].group];
          return [c, m = state[0], v = state[1], p = static_cast<const float*>(s.params)](
                     int64_t i, float g, SquareBins& p_sq, SquareBins& u_sq) {
            optim::adam_moments(g, m[i], v[i], c.adam);
            p_sq.add(p[i]);
            u_sq.add(optim::lamb_direction(p[i], m[i], v[i], c.weight_decay, c.adam));
          };
        },
        wait);
  }

  absl::Status apply(const StepArgs& a, const std::vector<optim::LambCoeffs>& coeffs,
                     const std::vector<float>& neg_step) {
#if ZERO_HAS_CUDA
    if (device().is_cuda()) {
      return optim::lamb_apply_cuda(device().index, layout(), coeffs, neg_step, a, state_data(0), state_data(1));
    }
#endif
    const PassAccess access{.params = Use::kWrite, .state = Use::kRead};
    return run_cpu_pass(
        "lamb apply", a, access,
        [coeffs, neg_step](const ShardLayout& layout, const StepArgs& s, const std::vector<float*>& state) {
          const float* __restrict m = state[0];
          const float* __restrict v = state[1];
          float* __restrict p = s.params;
          optim::update_chunks(layout, *s.half, s.params, s.step, [&](int64_t, const ShardChunk& ch) {
            const optim::LambCoeffs c = coeffs[layout.params()[ch.param].group];
            const float step = neg_step[ch.param];
            for (int64_t i = ch.begin; i < ch.end; ++i) {
              p[i] = p[i] + step * optim::lamb_direction(p[i], m[i], v[i], c.weight_decay, c.adam);
            }
          });
          return absl::OkStatus();
        });
  }

  LambOptions options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> make_lamb(const LambOptions& options, ShardLayout layout,
                                                     Allocator& allocator, Device device) {
  if (!(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1 && options.eps >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("LAMB betas (", options.beta1, ", ", options.beta2, ") and eps ",
                                                   options.eps, ": betas must lie in [0, 1) and eps be >= 0"));
  }
  if (!(options.min_trust_ratio >= 0 && options.min_trust_ratio <= options.max_trust_ratio)) {
    return absl::InvalidArgumentError(absl::StrCat("LAMB trust ratio range [", options.min_trust_ratio, ", ",
                                                   options.max_trust_ratio, "]: needs 0 <= min <= max"));
  }
  ZERO_RETURN_IF_ERROR(optim::check_device(device, "LAMB", /*has_cuda_kernel=*/true));
  auto opt = std::make_unique<Lamb>(options, std::move(layout), device);
  ZERO_RETURN_IF_ERROR(opt->allocate_state(allocator, {"exp_avg", "exp_avg_sq"}));
  ZERO_RETURN_IF_ERROR(opt->allocate_bins(allocator));
  return opt;
}

}  // namespace zero
