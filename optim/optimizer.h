// The optimizer interface: update one rank's flat fp32 shard in place, keeping state for that shard only.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "optim/shard_layout.h"
#include "optim/square_sum.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "runtime/tensor.h"

namespace zero {

// Mixed precision: the low-precision copy of the shard written in the same pass as the update.
struct HalfCopy {
  Tensor out;               // bf16 or fp16 (S), on the optimizer's device; undefined = no copy
  bool stochastic = false;  // round stochastically, with bits drawn from (seed, step, flat index)
  uint64_t seed = 0;

  bool enabled() const { return out.data() != nullptr; }
};

namespace optim {
// One step's inputs as the optimizers' update loops see them.
struct ShardStep {
  float* params;       // (S)
  const float* grads;  // (S)
  int64_t step;
  double lr;
  Communicator* comm;
  const HalfCopy* half;
};
}  // namespace optim

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual absl::string_view name() const = 0;
  // Whether step() communicates over its `comm` (LAMB/LARS: whole-parameter norms of a slice).
  virtual bool communicates() const { return false; }
  const ShardLayout& layout() const { return *layout_; }
  Device device() const { return device_; }

  // One update of the shard. params and grads: fp32 (S) on device(), S = layout().shard_numel(); only
  // elements inside parameters are touched. `step` counts from 1 (bias correction, first momentum).
  // `lr` is the schedule's value; each group scales it by its lr_scale. `comm` is this rank's
  // communicator, or null when the shard holds every parameter whole (LAMB/LARS check this).
  absl::Status step(Tensor params, Tensor grads, int64_t step, float lr, Communicator* comm = nullptr,
                    const HalfCopy& half = {});

  // This rank's state, one fp32 (S) tensor per name (e.g. "exp_avg"), for checkpoints.
  std::vector<std::pair<std::string, Tensor>> state() const;

 protected:
  using StepArgs = optim::ShardStep;

  Optimizer(ShardLayout layout, Device device)
      : layout_(std::make_shared<const ShardLayout>(std::move(layout))), device_(device) {}

 public:
  // Zero-filled (S) fp32 buffers in MemoryCategory::kOptimizerState, one per name.
  absl::Status allocate_state(Allocator& allocator, const std::vector<std::string>& names);

 protected:
  float* state_data(int i) const { return static_cast<float*>(state_[i].second.data()); }
  virtual absl::Status update(const StepArgs& args) = 0;

  // One pass of an update's CPU loops: `args` and `state` (state_data(i) of every buffer) as the loops may touch
  // them from the host.
  using CpuPass =
      std::function<absl::Status(const ShardLayout& layout, const StepArgs& args, const std::vector<float*>& state)>;
  // What a pass does to params (and the half copy, written with them) and to the state buffers; grads are read.
  enum class Use : uint8_t { kNone, kRead, kWrite };
  struct PassAccess {
    Use params = Use::kWrite;
    Use state = Use::kWrite;
  };
  // Runs `cpu` where the shard lives: at once on the CPU; on a simulated device as a launch named `name` on its
  // legacy default stream declaring grads, params, the half copy and every state buffer as `access` says, `cpu`
  // getting host views of them (null where kNone; args.comm null: communicate on the host, between passes).
  // There it runs after this returns unless `wait`, so `cpu` captures by value, and never `this`; what it writes
  // for the host to read must be waited for.
  absl::Status run_cpu_pass(std::string name, const StepArgs& args, PassAccess access, CpuPass cpu,
                            bool wait = false) const;

  // LAMB/LARS: the norms of two quantities per whole parameter. `per_chunk[c]` holds the exact square
  // sums of chunk c of layout().chunks(); they are combined per parameter and across ranks with one
  // int32 allreduce for all parameters. Returns {sqrt(sum a), sqrt(sum b)} per parameter.
  absl::StatusOr<std::vector<std::array<double, 2>>> whole_param_norms(
      const std::vector<std::array<SquareSum, 2>>& per_chunk, Communicator* comm) const;

 private:
  std::shared_ptr<const ShardLayout> layout_;  // shared with the simulated device's launches, which may outlive us
  Device device_;
  std::vector<std::pair<std::string, Buffer>> state_;
};

namespace optim {
// OK for the CPU and the simulated device (which runs the CPU loops); for CUDA only when zero was built with CUDA
// and the optimizer has a kernel.
absl::Status check_device(Device device, absl::string_view optimizer, bool has_cuda_kernel);
// LAMB/LARS on CUDA: device scratch for the exact square bins of their norm pass (optim_kernels.h); an empty
// buffer on the CPU and the simulated device, whose bins live on the stack of the CPU loops.
absl::StatusOr<Buffer> allocate_square_bins(const ShardLayout& layout, Allocator& allocator, Device device);
}  // namespace optim

}  // namespace zero
