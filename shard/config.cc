// ZeroConfig: the checks of its values, and the gradient-bucket rule the engine and the tools share.
#include "shard/config.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shard/stage.h"

namespace zero {

absl::Status ZeroConfig::validate(absl::string_view key_prefix) const {
  const auto bad = [&](absl::string_view key, auto value, absl::string_view rule) {
    return absl::InvalidArgumentError(absl::StrCat(key_prefix, key, " = ", value, ": ", rule));
  };
  if (!StagePolicy::valid(stage)) return bad("stage", stage, "the stage is 0, 1, 2 or 3");
  const StagePolicy policy(stage);
  if (wrap_min_params < 0) return bad("wrap_min_params", wrap_min_params, "must be >= 0 (0 = one flat unit per unit)");
  if (bucket_cap_bytes <= 0) return bad("bucket_cap_bytes", bucket_cap_bytes, "must be positive");
  if (first_bucket_cap_bytes <= 0) return bad("first_bucket_cap_bytes", first_bucket_cap_bytes, "must be positive");
  if (max_live_units < 1) return bad("max_live_units", max_live_units, "at least one gathered unit must fit");
  if (persistence_threshold < 0) return bad("persistence_threshold", persistence_threshold, "must be >= 0");
  if (accumulation_steps < 1) return bad("accumulation_steps", accumulation_steps, "must be >= 1");
  if (no_sync && policy.partitions_gradients()) {
    return bad("no_sync", "true",
               "stages 2 and 3 keep only their gradient slice and reduce every micro-batch; "
               "use stage 0 or 1, or turn no_sync off");
  }
  if (gradient_clipping < 0) return bad("gradient_clipping", gradient_clipping, "must be >= 0 (0 = off)");
  for (const auto& [key, path] :
       {std::pair{"offload_optimizer_path", &offload_optimizer_path}, {"offload_param_path", &offload_param_path}}) {
    if (!path->empty() && !device.is_cpu()) {
      return bad(key, *path,
                 absl::StrCat("offloading from ", device.to_string(),
                              " to files is not built; train on the CPU, or keep the states in host memory "
                              "(offload_optimizer_to_host) or on the device"));
    }
  }
  if (tf32 && !device.is_cuda()) {
    return bad("tf32", "true",
               absl::StrCat("TF32 runs on CUDA's tensor cores; ", device.to_string(),
                            " computes fp32 GEMMs exactly: set it false, or train on a CUDA device"));
  }
  if (optimizer_swap.buffer_count < 1) {
    return bad("optimizer_swap.buffer_count", optimizer_swap.buffer_count, "RAM must hold at least one tensor");
  }
  if (offload_param_to_host && !(offload_optimizer_to_host && policy.partitions_params())) {
    return bad("offload_param_to_host", "true",
               absl::StrCat("the parameter shards go to host memory at stage 3 with the optimizer there, which writes "
                            "them (stage ",
                            stage, ", offload_optimizer_to_host ", offload_optimizer_to_host ? "true" : "false",
                            "); use stage 3 and offload_optimizer_to_host"));
  }
  if (delayed_update_after < -1) {
    return bad("delayed_update_after", delayed_update_after, "must be >= 0 (steps updated at once first), or -1: off");
  }
  if (delayed_update_after >= 0 && (!offload_optimizer_to_host || offload_param_to_host)) {
    return bad("delayed_update_after", delayed_update_after,
               "a delayed update overlaps the host optimizer with the device's next step, so it needs "
               "offload_optimizer_to_host, and the parameter shards on the device (offload_param_to_host false: "
               "the next step's gathers would read the shards the update writes)");
  }
  if (offload_optimizer_to_host && device.is_cpu()) {
    return bad("offload_optimizer_to_host", "true",
               "the engine is on the CPU, where its optimizer runs already; set it false, or name a device");
  }
  if (!offload_param_path.empty() && !policy.partitions_params()) {
    return bad("offload_param_path", offload_param_path,
               absl::StrCat("stage ", stage,
                            " keeps every parameter whole on every rank, and offload_param moves "
                            "the shards of stage 3; use stage 3, or offload the optimizer instead"));
  }
  if (!is_floating(precision)) return bad("precision", dtype_name(precision), "use fp32, bf16 or fp16");
  constexpr double kFloatMax = std::numeric_limits<float>::max();  // the optimizers divide by the scale in fp32
  if (loss_scaling.initial_scale <= 0 || loss_scaling.min_scale <= 0 || loss_scaling.static_scale < 0 ||
      loss_scaling.window < 1 || loss_scaling.hysteresis < 1 || loss_scaling.initial_scale > kFloatMax ||
      loss_scaling.static_scale > kFloatMax) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_prefix,
                     "loss_scaling: static_scale must be >= 0 (0 means dynamic), and initial_scale, min_scale, window "
                     "and hysteresis positive; the scales at most 3.4e38 (a float)"));
  }
  return absl::OkStatus();
}

bool ZeroConfig::stages_gradients(int world_size) const {
  return !(StagePolicy(stage).updates_everything() && world_size == 1 && accumulation_steps == 1);
}

std::vector<std::vector<int>> ZeroConfig::gradient_buckets(const std::vector<int64_t>& padded_numels) const {
  // Backward order is reverse unit order. A bucket spans units only where every rank updates everything:
  // a reduce-scatter of one unit per bucket gives each rank a contiguous slice of it.
  const bool spans_units = StagePolicy(stage).updates_everything();
  const int64_t element_bytes = static_cast<int64_t>(dtype_size(precision));  // buckets hold the training dtype
  std::vector<std::vector<int>> buckets;
  std::vector<int> current;
  int64_t current_numel = 0;
  for (int i = static_cast<int>(padded_numels.size()) - 1; i >= 0; --i) {
    const int64_t cap_bytes = buckets.empty() ? first_bucket_cap_bytes : bucket_cap_bytes;
    if (!current.empty() && (!spans_units || (current_numel + padded_numels[i]) * element_bytes > cap_bytes)) {
      buckets.push_back(std::move(current));
      current = {};
      current_numel = 0;
    }
    current.push_back(i);
    current_numel += padded_numels[i];
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

}  // namespace zero
