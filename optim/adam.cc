// Adam and AdamW (torch.optim.Adam / torch.optim.AdamW, single-tensor path).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "optim/adam_coeffs.h"
#include "optim/cpu_loops.h"
#include "optim/optimizers.h"
#include "runtime/status.h"
#include "runtime/vector_clones.h"
#if ZERO_HAS_CUDA
#include "optim/cuda/optim_kernels.h"
#endif

namespace zero {
namespace {

// The update of p[0, n) and its moments; AVX2 where the CPU has it (the same bits: elementwise, no FMA).
ZERO_VECTOR_CLONES void adam_range(float* __restrict p, const float* __restrict g, float* __restrict m,
                                   float* __restrict v, int64_t n, const optim::AdamCoeffs c) {
  for (int64_t i = 0; i < n; ++i) p[i] = optim::adam_element(p[i], g[i], m[i], v[i], c);
}

class Adam final : public Optimizer {
 public:
  Adam(const AdamOptions& options, ShardLayout layout, Device device)
      : Optimizer(std::move(layout), device), options_(options) {}
  absl::string_view name() const override { return options_.decoupled_weight_decay ? "AdamW" : "Adam"; }

 private:
  absl::Status update(const StepArgs& a) override {
    std::vector<optim::AdamCoeffs> coeffs;
    for (const ParamGroup& g : layout().groups()) {
      coeffs.push_back(
          optim::adam_coeffs(options_.beta1, options_.beta2, options_.eps, options_.decoupled_weight_decay, a, g));
    }
#if ZERO_HAS_CUDA
    if (device().is_cuda()) return optim::adam_cuda(device().index, layout(), coeffs, a, state_data(0), state_data(1));
#endif
    return run_cpu_pass("adam", a, {},
                        [coeffs](const ShardLayout& layout, const StepArgs& s, const std::vector<float*>& state) {
                          optim::update_chunks(layout, *s.half, s.params, s.step, [&](int64_t, const ShardChunk& ch) {
                            const optim::AdamCoeffs& c = coeffs[layout.params()[ch.param].group];
                            optim::for_each_gradient_piece(s.grads, ch, [&](const float* g, int64_t b, int64_t e) {
                              adam_range(s.params + b, g, state[0] + b, state[1] + b, e - b, c);
                            });
                          });
                          return absl::OkStatus();
                        });
  }

  AdamOptions options_;
};

}  // namespace

optim::AdamCoeffs optim::adam_coeffs(double beta1, double beta2, double eps, bool decoupled, const ShardStep& a,
                                     const ParamGroup& g) {
  const double lr = a.lr * g.lr_scale;
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(a.step));
  AdamCoeffs c;
  c.l2 = decoupled ? 0.0f : g.weight_decay;
  c.decay = decoupled ? static_cast<float>(1.0 - lr * g.weight_decay) : 1.0f;
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.neg_step_size = static_cast<float>(-(lr / bc1));
  c.bias_correction1 = static_cast<float>(bc1);
  c.bias_correction2 = static_cast<float>(bc2);
  c.bias_correction2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = static_cast<float>(eps);
  return c;
}

absl::StatusOr<std::unique_ptr<Optimizer>> make_adam(const AdamOptions& options, ShardLayout layout,
                                                     Allocator& allocator, Device device) {
  if (!(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1 && options.eps >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("Adam betas (", options.beta1, ", ", options.beta2, ") and eps ",
                                                   options.eps, ": betas must lie in [0, 1) and eps be >= 0"));
  }
  ZERO_RETURN_IF_ERROR(optim::check_device(device, "Adam", /*has_cuda_kernel=*/true));
  auto opt = std::make_unique<Adam>(options, std::move(layout), device);
  ZERO_RETURN_IF_ERROR(opt->allocate_state(allocator, {"exp_avg", "exp_avg_sq"}));
  return opt;
}

}  // namespace zero
