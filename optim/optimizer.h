// The optimizer interface: update one rank's flat fp32 shard in place, keeping state for that shard only.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "optim/element_math.h"
#include "optim/shard_layout.h"
#include "optim/square_sum.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "runtime/device_api.h"
#include "runtime/tensor.h"

namespace zero {

// Mixed precision: the low-precision copy of the shard written in the same pass as the update.
struct HalfCopy {
  Tensor out;               // bf16 or fp16 (S), on the optimizer's device; undefined = no copy
  bool stochastic = false;  // round stochastically, with bits drawn from (seed, step, flat index)
  uint64_t seed = 0;

  bool enabled() const { return out.data() != nullptr; }
};

// A shard's gradients for one update: fp32, bf16 or fp16 (S) on the optimizer's device, each element read widened to
// fp32, divided by `loss_scale` where that is not 1 and multiplied by `clip` where that is below 1, each in fp32 (the
// bits separate unscale and clip passes over an fp32 copy would leave), with no fp32 copy made. A Tensor converts to
// its own gradients, unscaled.
struct Gradients {
  Tensor values;
  float loss_scale = 1.0f;
  float clip = 1.0f;

  Gradients(Tensor v) : values(std::move(v)) {}  // NOLINT(google-explicit-constructor): a tensor is its gradients
  Gradients(Tensor v, float loss_scale, float clip) : values(std::move(v)), loss_scale(loss_scale), clip(clip) {}
};

// LAMB/LARS: {||p||, ||u||} (or {||p||, ||g||}) of every whole parameter of a shard's layout, in its order.
using WholeParamNorms = std::vector<std::array<double, 2>>;
// Exact square sums of the two quantities, per chunk of a layout (ShardLayout::chunks).
using ChunkSquareSums = std::vector<std::array<SquareSum, 2>>;

// Reads a first pass's sums: call it once they are complete (see NormParts; on CUDA it waits for them itself), and
// before the optimizer's next first pass or its end (on CUDA it reads the optimizer's pinned bins, which the next
// pass overwrites).
using ChunkSumsReader = std::function<absl::StatusOr<ChunkSquareSums>()>;

// A shard's part of its whole-parameter norms, as its first pass leaves it: on a device, complete once the work
// queued there before it is done (Optimizer::measure does not wait for it), so read only then.
struct NormParts {
  std::shared_ptr<const ShardLayout> layout;
  ChunkSumsReader read_sums;
};

// Every shard's norms from its parts, summed across ranks with one int32 allreduce over `comm` for all of them
// (none where comm is null or alone): what Optimizer::measure gives an engine, turned into what Optimizer::step
// takes. Call it once the parts are complete.
absl::StatusOr<std::vector<WholeParamNorms>> reduce_norm_parts(const std::vector<NormParts>& parts, Communicator* comm);

namespace optim {
// One step's inputs as the optimizers' update loops see them.
struct ShardStep {
  float* params;       // (S)
  GradientRead grads;  // (S)
  int64_t step;
  double lr;
  Communicator* comm;
  const HalfCopy* half;
  const WholeParamNorms* norms;  // given: measure() ran the first pass, and step() only applies
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

  // One update of the shard. params: fp32 (S) on device(), S = layout().shard_numel(); grads as Gradients says. Only
  // elements inside parameters are touched. `step` counts from 1 (bias correction, first momentum).
  // `lr` is the schedule's value; each group scales it by its lr_scale. `comm` is this rank's
  // communicator, or null when the shard holds every parameter whole (LAMB/LARS check this).
  absl::Status step(Tensor params, const Gradients& grads, int64_t step, float lr, Communicator* comm = nullptr,
                    const HalfCopy& half = {}, const WholeParamNorms* norms = nullptr);

  // An optimizer that communicates, split around its norms so that an engine sums every shard's with one
  // allreduce (reduce_norm_parts): measure() queues the step's first pass (LAMB's updates the moments) and returns
  // this shard's part, which on a device is complete once the device's queued work is done (so an engine waits
  // once for every shard's); step() with the summed norms then runs only the second. Bit-identical to step() alone.
  absl::StatusOr<NormParts> measure(Tensor params, const Gradients& grads, int64_t step, float lr);

  // This rank's state, one fp32 (S) tensor per name (e.g. "exp_avg"), for checkpoints.
  std::vector<std::pair<std::string, Tensor>> state() const;

 protected:
  using StepArgs = optim::ShardStep;
  // step()'s and measure()'s checks of their inputs.
  absl::Status check_step(const Tensor& params, const Gradients& grads, int64_t step, float lr) const;

  Optimizer(ShardLayout layout, Device device)
      : layout_(std::make_shared<const ShardLayout>(std::move(layout))), device_(device) {}

 public:
  // Zero-filled (S) fp32 buffers in MemoryCategory::kOptimizerState, one per name.
  absl::Status allocate_state(Allocator& allocator, const std::vector<std::string>& names);

 protected:
  float* state_data(int i) const { return static_cast<float*>(state_[i].second.data()); }
  virtual absl::Status update(const StepArgs& args) = 0;
  // The first pass of an optimizer that communicates: the exact square sums of each chunk of layout().chunks(),
  // complete when this returns if `wait`, else (on a device) once the device's queued work is done.
  virtual absl::StatusOr<ChunkSumsReader> chunk_square_sums(const StepArgs& args, bool wait);

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
  // current stream (runtime/device_api.h) declaring grads, params, the half copy and every state buffer as `access`
  // says, `cpu` getting host views of them (null where kNone; args.comm null: communicate on the host, between passes).
  // There it runs after this returns unless `wait`, so `cpu` captures by value, and never `this`; what it writes
  // for the host to read must be waited for.
  absl::Status run_cpu_pass(std::string name, const StepArgs& args, PassAccess access, CpuPass cpu,
                            bool wait = false) const;

  // LAMB/LARS: the norms of two quantities per whole parameter: args.norms where measure() ran, else from the first
  // pass's chunk sums, combined per parameter and across ranks with one int32 allreduce for all parameters.
  // Returns {sqrt(sum a), sqrt(sum b)} per parameter.
  absl::StatusOr<WholeParamNorms> whole_param_norms(const StepArgs& args);

 private:
  std::shared_ptr<const ShardLayout> layout_;  // shared with the simulated device's launches, which may outlive us
  Device device_;
  std::vector<std::pair<std::string, Buffer>> state_;
};

namespace optim {
// OK for the CPU and the simulated device (which runs the CPU loops); for CUDA only when zero was built with CUDA
// and the optimizer has a kernel.
absl::Status check_device(Device device, absl::string_view optimizer, bool has_cuda_kernel);
// LAMB/LARS on CUDA: the exact square bins of their norm pass (optim_kernels.h), filled on the device and brought
// back by a queued copy into pinned host memory, both reused every step; empty on the CPU and the simulated device,
// whose bins live on the stack of the CPU loops.
struct SquareBinsScratch {
  Buffer device;
  Buffer host;                       // pinned
  std::optional<OwnedEvent> copied;  // recorded after the copy into `host`
};
absl::StatusOr<SquareBinsScratch> allocate_square_bins(const ShardLayout& layout, Allocator& allocator, Device device);
}  // namespace optim

}  // namespace zero
