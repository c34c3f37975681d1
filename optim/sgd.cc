// SGD with momentum, Nesterov and weight decay (torch.optim.SGD).
#include "absl/strings/str_cat.h"
#include "optim/cpu_loops.h"
#include "optim/optimizers.h"
#include "runtime/status.h"
#if ZERO_HAS_CUDA
#include "optim/cuda/optim_kernels.h"
#endif

namespace zero {
namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(const SgdOptions& options, ShardLayout layout, Device device)
      : Optimizer(std::move(layout), device), options_(options) {}
  absl::string_view name() const override { return "SGD"; }

 private:
  absl::Status update(const StepArgs& a) override {
    std::vector<optim::SgdCoeffs> coeffs;
    for (const ParamGroup& g : layout().groups()) {
      optim::SgdCoeffs c;
      c.neg_lr = static_cast<float>(-(a.lr * g.lr_scale));
      c.momentum = static_cast<float>(options_.momentum);
      c.one_minus_dampening = static_cast<float>(1.0 - options_.dampening);
      c.weight_decay = g.weight_decay;
      c.nesterov = options_.nesterov;
      c.first_step = a.step == 1;
      coeffs.push_back(c);
    }
#if ZERO_HAS_CUDA
    if (device().is_cuda()) {
      return optim::sgd_cuda(device().index, layout(), coeffs, a, options_.momentum != 0.0 ? state_data(0) : nullptr);
    }
#endif
    // Without momentum there is no state buffer.
    return run_cpu_pass(
        "sgd", a, {}, [coeffs](const ShardLayout& layout, const StepArgs& s, const std::vector<float*>& state) {
          float* buf = state.empty() ? nullptr : state[0];
          optim::update_chunks(layout, *s.half, s.params, s.step, [&](int64_t, const ShardChunk& ch) {
            const optim::SgdCoeffs group = coeffs[layout.params()[ch.param].group];
            optim::for_each_gradient_piece(s.grads, ch, [&](const float* __restrict g, int64_t b, int64_t e) {
              const optim::SgdCoeffs c = group;  // a local copy: GCC then lifts its branches out of the loops below,
                                                 // which vectorize
              float* __restrict p = s.params + b;
              if (buf != nullptr) {
                float* __restrict m = buf + b;
                for (int64_t i = 0; i < e - b; ++i) p[i] = optim::sgd_element(p[i], g[i], m[i], c);
              } else {
                for (int64_t i = 0; i < e - b; ++i) {
                  float unused = 0.0f;
                  p[i] = optim::sgd_element(p[i], g[i], unused, c);
                }
              }
            });
          });
          return absl::OkStatus();
        });
  }

  SgdOptions options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> make_sgd(const SgdOptions& options, ShardLayout layout, Allocator& allocator,
                                                    Device device) {
  if (options.momentum < 0 || (options.nesterov && (options.momentum <= 0 || options.dampening != 0))) {
    return absl::InvalidArgumentError(absl::StrCat("SGD momentum ", options.momentum, ", dampening ", options.dampening,
                                                   ": momentum must be >= 0, and Nesterov needs momentum > 0 and "
                                                   "dampening 0 (as torch.optim.SGD)"));
  }
  ZERO_RETURN_IF_ERROR(optim::check_device(device, "SGD", /*has_cuda_kernel=*/true));
  auto opt = std::make_unique<Sgd>(options, std::move(layout), device);
  if (options.momentum != 0) ZERO_RETURN_IF_ERROR(opt->allocate_state(allocator, {"momentum_buffer"}));
  return opt;
}

}  // namespace zero
