// LARS (You et al. 2017, Algorithm 1) with whole-parameter local learning rates from one allreduce per step.
#include <array>

#include "absl/strings/str_cat.h"
#include "optim/cpu_loops.h"
#include "optim/optimizers.h"
#include "runtime/status.h"

namespace zero {
namespace {

class Lars final : public Optimizer {
 public:
  Lars(const LarsOptions& options, ShardLayout layout, Device device)
      : Optimizer(std::move(layout), device), options_(options) {}
  absl::string_view name() const override { return "LARS"; }

 private:
  absl::Status update(const StepArgs& a) override {
    float* __restrict v = state_data(0);
    float* __restrict p = a.params;
    const float* __restrict g = a.grads;
    std::vector<std::array<SquareSum, 2>> sums(layout().chunks().size());
    optim::for_each_chunk(layout(), [&](int64_t k, const ShardChunk& ch) {
      SquareBins p_sq, g_sq;
      for (int64_t i = ch.begin; i < ch.end; ++i) {
        p_sq.add(p[i]);
        g_sq.add(g[i]);
      }
      sums[k][0].add(p_sq);
      sums[k][1].add(g_sq);
    });
    using Norms = std::vector<std::array<double, 2>>;
    ZERO_ASSIGN_OR_RETURN(Norms norms, whole_param_norms(sums, a.comm));
    std::vector<float> scaled_lr(norms.size());
    for (size_t i = 0; i < norms.size(); ++i) {
      const auto [p_norm, g_norm] = norms[i];
      const ParamGroup& group = layout().group_of(static_cast<int>(i));
      const double local_lr = p_norm > 0 && g_norm > 0
                                  ? options_.trust_coefficient * p_norm / (g_norm + group.weight_decay * p_norm)
                                  : 1.0;
      scaled_lr[i] = static_cast<float>(a.lr * group.lr_scale * local_lr);
    }
    const float momentum = static_cast<float>(options_.momentum);
    optim::update_chunks(layout(), *a.half, a.params, a.step, [&](int64_t, const ShardChunk& ch) {
      const float lr = scaled_lr[ch.param];
      const float wd = layout().group_of(ch.param).weight_decay;
      for (int64_t i = ch.begin; i < ch.end; ++i) p[i] = optim::lars_element(p[i], g[i], v[i], momentum, lr, wd);
    });
    return absl::OkStatus();
  }

  LarsOptions options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> make_lars(const LarsOptions& options, ShardLayout layout,
                                                     Allocator& allocator, Device device) {
  if (!(options.momentum >= 0 && options.trust_coefficient > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("LARS momentum ", options.momentum, " and trust coefficient ",
                                                   options.trust_coefficient, ": need momentum >= 0 and a positive "
                                                   "trust coefficient"));
  }
  ZERO_RETURN_IF_ERROR(optim::check_device(device, "LARS", /*has_cuda_kernel=*/false));
  auto opt = std::make_unique<Lars>(options, std::move(layout), device);
  ZERO_RETURN_IF_ERROR(opt->allocate_state(allocator, {"momentum_buffer"}));
  return opt;
}

}  // namespace zero
