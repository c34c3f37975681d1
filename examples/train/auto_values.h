// "auto", the Hugging Face Trainer's placeholder in DeepSpeed configs: filled here, in one place, with what
// the Trainer would put there (transformers/integrations/deepspeed.py, HfTrainerDeepSpeedConfig) from what
// zero-train knows in place of the Trainer's arguments.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "examples/train/train_config.h"
#include "nlohmann/json.hpp"

namespace zero::train {

// The micro-batch an all-"auto" batch gets: TrainingArguments.per_device_train_batch_size's default.
inline constexpr int64_t kAutoMicroBatch = 8;

// Takes every "auto" value out of the tree and returns their keys ("optimizer.params.lr"), in key order, so
// that the reader sees only values and leaves those keys' fields at their defaults for fill_auto_values.
// checkpoint.resume keeps its "auto", which is a value of its own.
std::vector<std::string> take_auto_values(nlohmann::json& root);

// What the config reader knows of a key "auto" has no value for: a key that takes any value asks for
// nothing, and the others are refused showing their default.
struct KeyFacts {
  bool takes_any_value = false;
  std::optional<nlohmann::json> default_value;
};

// Sets the field of each key in `auto_keys` as the Trainer would with its default arguments:
//   train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps: derived from the others by
//     the batch rule (resolve_batch); with neither batch size known, a micro-batch of kAutoMicroBatch
//   gradient_clipping: 1.0 (max_grad_norm)
//   optimizer.params.lr, .betas, .eps, .weight_decay: zero's defaults (1e-3, [0.9, 0.999], 1e-8, 0); HF's
//     are the same but for its lr of 5e-5, a fine-tuning rate where zero-train trains from scratch
//   scheduler.params.warmup_min_lr 0, .warmup_max_lr the optimizer's lr, .warmup_num_steps 0,
//     .total_num_steps the run's steps
//   zero_optimization.reduce_bucket_size hidden², .stage3_prefetch_bucket_size 0.9·hidden²,
//     .stage3_param_persistence_threshold 10·hidden, for the model's hidden size (GPT-2's channels, the
//     MLP's widest layer)
//   fp16.enabled, bf16.enabled, amp.enabled: false (HF takes them from --fp16/--bf16, which zero-train lacks)
// Keys it has no value for are refused together, in one message naming each and its default.
absl::Status fill_auto_values(const std::vector<std::string>& auto_keys,
                              const std::function<KeyFacts(const std::string&)>& facts, TrainConfig& config);

}  // namespace zero::train
