// The optimizers: SGD, Adam/AdamW, LAMB and LARS over one rank's flat fp32 shard, matching PyTorch's formulas.
#pragma once

#include <limits>
#include <memory>

#include "absl/status/statusor.h"
#include "optim/optimizer.h"
#include "optim/shard_layout.h"
#include "runtime/allocator.h"

namespace zero {

// Weight decay and learning-rate scale come from each parameter's ParamGroup. Hyper-parameters are
// doubles, like PyTorch's Python floats, and are rounded to fp32 where PyTorch rounds them.

// torch.optim.SGD: d = g + wd*p; buf = d on step 1, else momentum*buf + (1-dampening)*d;
// d = nesterov ? d + momentum*buf : buf; p -= lr*d. State: "momentum_buffer" when momentum != 0.
struct SgdOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
};
absl::StatusOr<std::unique_ptr<Optimizer>> make_sgd(const SgdOptions& options, ShardLayout layout, Allocator& allocator,
                                                    Device device = Device::cpu());

// torch.optim.Adam (decoupled_weight_decay = false: wd*p added to the gradient) and torch.optim.AdamW
// (true: p *= 1 - lr*wd first). Bias correction on both moments; eps is added to sqrt(v)/sqrt(1-beta2^t)
// as in PyTorch. State: "exp_avg", "exp_avg_sq".
struct AdamOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool decoupled_weight_decay = true;
};
absl::StatusOr<std::unique_ptr<Optimizer>> make_adam(const AdamOptions& options, ShardLayout layout,
                                                     Allocator& allocator, Device device = Device::cpu());

// Where LAMB corrects the bias of its moments.
enum class LambBiasCorrection {
  kMoments,   // You et al.: u from m_hat = m / (1 - beta1^t) and v_hat = v / (1 - beta2^t)
  kStepSize,  // DeepSpeed's FusedLamb: u from m and v, the step times sqrt(1 - beta2^t) / (1 - beta1^t)
  kNone,      // u from m and v, the step lr * trust ratio (FusedLamb's bias_correction = false)
};

// LAMB, You et al. 2019 ("Large Batch Optimization for Deep Learning"), Algorithm 2 with phi = identity:
// m, v as Adam; r = m_hat / (sqrt(v_hat) + eps); u = r + wd*p; p -= lr * (||p|| / ||u||) * u, with the
// trust ratio 1 when either norm is 0. Norms are of each whole parameter. State: "exp_avg", "exp_avg_sq".
// DeepSpeed's FusedLamb is {.bias_correction = kStepSize, .min_trust_ratio = 0.01, .max_trust_ratio = 10}.
struct LambOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  LambBiasCorrection bias_correction = LambBiasCorrection::kMoments;
  // A trust ratio computed from two nonzero norms is clamped to [min, max] (FusedLamb's min_coeff, max_coeff).
  double min_trust_ratio = 0;
  double max_trust_ratio = std::numeric_limits<double>::infinity();
};
absl::StatusOr<std::unique_ptr<Optimizer>> make_lamb(const LambOptions& options, ShardLayout layout,
                                                     Allocator& allocator, Device device = Device::cpu());

// LARS, You et al. 2017 ("Large Batch Training of Convolutional Networks"), Algorithm 1:
// local_lr = trust_coefficient * ||p|| / (||g|| + wd*||p||) (1 when either norm is 0);
// v = momentum*v + lr*local_lr*(g + wd*p); p -= v. Norms are of each whole parameter. State: "momentum_buffer".
struct LarsOptions {
  double momentum = 0.9;
  double trust_coefficient = 0.001;
};
absl::StatusOr<std::unique_ptr<Optimizer>> make_lars(const LarsOptions& options, ShardLayout layout,
                                                     Allocator& allocator, Device device = Device::cpu());

}  // namespace zero
