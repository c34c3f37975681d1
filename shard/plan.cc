// The planner's arithmetic: model-state bytes, bytes sent per step, and the largest model a budget holds.
#include "shard/plan.h"

#include "absl/strings/str_cat.h"
#include "runtime/status.h"
#include "shard/stage.h"

namespace zero {
namespace {

absl::Status invalid(absl::string_view field, int64_t value, absl::string_view accepted) {
  return absl::InvalidArgumentError(absl::StrCat("plan: ", field, " = ", value, "; ", accepted));
}

// p: bytes per parameter and per gradient.
int64_t param_bytes(DType precision) { return static_cast<int64_t>(dtype_size(precision)); }
// m: fp32 master weights under bf16/fp16.
int64_t master_bytes(DType precision) { return precision == DType::kF32 ? 0 : 4; }

}  // namespace

absl::Status PlanInput::validate() const {
  if (params < 0) return invalid("params", params, "the parameter count must be >= 0");
  if (world_size < 1) return invalid("world_size", world_size, "need at least 1 rank");
  if (!StagePolicy::valid(stage)) return invalid("stage", stage, "ZeRO stages are 0, 1, 2 and 3");
  if (precision != DType::kF32 && precision != DType::kBF16 && precision != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: precision = ", dtype_name(precision), "; use fp32, bf16 or fp16"));
  }
  if (optimizer_state_bytes < 0) {
    return invalid("optimizer_state_bytes", optimizer_state_bytes, "bytes per parameter must be >= 0");
  }
  if (offload_param_to_host && !(offload_optimizer_to_host && StagePolicy(stage).partitions_params())) {
    return absl::InvalidArgumentError(
        "plan: offload_param_to_host moves stage 3's parameter shards beside an optimizer in host memory; use stage 3 "
        "and offload_optimizer_to_host");
  }
  if (offload_optimizer_to_host && (offload_optimizer || offload_param)) {
    return absl::InvalidArgumentError(
        "plan: offload_optimizer_to_host is for an engine on a device, and offload to files for one on the CPU; "
        "pick one");
  }
  if (offload_param && !StagePolicy(stage).partitions_params()) {
    return invalid("stage", stage, "offload_param moves the parameter shards of stage 3; use stage 3");
  }
  if (accumulation_steps < 1) return invalid("accumulation_steps", accumulation_steps, "need at least 1");
  if (padded_params != 0 && (padded_params < params || padded_params % world_size != 0)) {
    return invalid("padded_params", padded_params,
                   absl::StrCat("need a multiple of world_size ", world_size, " and >= params ", params,
                                ", or 0 to pad params to the next multiple"));
  }
  return absl::OkStatus();
}

int64_t PlanInput::padded() const {
  return padded_params != 0 ? padded_params : (params + world_size - 1) / world_size * world_size;
}

ModelStateBytes model_state_bytes(const PlanInput& input) {
  ZERO_CHECK(input.validate().ok(), input.validate().ToString());
  const int64_t p = param_bytes(input.precision);
  const int64_t full = input.padded();
  const int64_t shard = full / input.world_size;
  const StagePolicy policy(input.stage);
  const int64_t updated = policy.updates_everything() ? input.params : shard;
  ModelStateBytes bytes{
      .params = p * (policy.partitions_params() ? shard : full),
      .grads = p * (policy.partitions_gradients() ? shard : full),
      .master_weights = (input.offload_optimizer_to_host ? 4 : master_bytes(input.precision)) * updated,
      .optimizer_state = input.optimizer_state_bytes * updated};
  if (input.offload_optimizer_to_host) {
    bytes.on_host = bytes.master_weights + bytes.optimizer_state;
    bytes.transfer_buffers = (input.offload_param_to_host ? 1 : 2) * p * updated;  // shard/host_offload.h
  }
  if (input.offload_param_to_host) bytes.on_host += bytes.params;
  if (input.offload_optimizer) {
    bytes.in_files = bytes.master_weights + bytes.optimizer_state;
    bytes.master_weights = bytes.optimizer_state = 0;
  }
  if (input.offload_param) {
    bytes.in_files += bytes.params;
    bytes.params = 0;
  }
  return bytes;
}

CommBytes comm_bytes_per_step(const PlanInput& input) {
  ZERO_CHECK(input.validate().ok(), input.validate().ToString());
  // One reduce-scatter or allgather of the padded model: pS(N - 1) bytes sent.
  const int64_t one_pass = param_bytes(input.precision) * (input.padded() / input.world_size) * (input.world_size - 1);
  const int64_t a = input.accumulation_steps;
  const StagePolicy policy(input.stage);
  // An allreduce is a reduce-scatter and an allgather. Where each rank updates its slice, gradients are
  // reduce-scattered per micro-batch and the updated slices allgathered once; partitioned parameters are
  // gathered for every forward and every backward instead.
  if (policy.updates_everything()) return {.param_gather = 0, .grad_reduce = 2 * a * one_pass};
  if (policy.partitions_params()) return {.param_gather = 2 * a * one_pass, .grad_reduce = a * one_pass};
  return {.param_gather = one_pass, .grad_reduce = a * one_pass};
}

int64_t largest_params_that_fit(const PlanInput& input, int64_t budget_bytes, int64_t other_bytes,
                                std::optional<int64_t> host_bytes) {
  const auto fits = [&](int64_t params) {
    PlanInput candidate = input;
    candidate.params = params;
    candidate.padded_params = 0;
    const ModelStateBytes states = model_state_bytes(candidate);
    return states.on_device() + other_bytes <= budget_bytes && (!host_bytes || states.host_memory() <= *host_bytes);
  };
  if (!fits(0)) return 0;
  // A rank holds at least 2 bytes (a bf16 value) per parameter, or per parameter of its 1/N at stage 3.
  int64_t fit = 0,
          no_fit = (budget_bytes / 2 + 1) * (StagePolicy(input.stage).partitions_params() ? input.world_size : 1);
  while (no_fit - fit > 1) {  // model states grow with Ψ: bisect the boundary
    const int64_t mid = fit + (no_fit - fit) / 2;
    (fits(mid) ? fit : no_fit) = mid;
  }
  return fit;
}

}  // namespace zero
