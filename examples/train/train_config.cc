#include "examples/train/train_config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "examples/train/auto_values.h"
#include "models/gpt2_config.h"
#include "nlohmann/json.hpp"
#include "runtime/allocator.h"
#include "runtime/status.h"
#include "shard/plan.h"
#include "shard/stage.h"

namespace zero::train {

namespace {

using json = nlohmann::json;

// Tuned by running it on 2 CPU cores: 1800 steps in under a minute. At 900 steps the whole answers it reached depended
// on the seed (100%, 72%, 0.6% and 33% for seeds 0, 1, 2 and the default 1234; fp32 bits as at 2bbcb77): the loss
// sits near 1.73 for a few hundred steps before the model finds the carries, and when it finds them varies. At 1800
// they reached 100%, 99.9%, 77% and 100%; a lower (0.001) or higher (0.006) peak learning rate did worse at 900 steps.
constexpr char kDefaultConfig[] = R"({
  "train_batch_size": 64,
  "train_micro_batch_size_per_gpu": 16,
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "betas": [0.9, 0.95], "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupCosineLR",
                "params": {"warmup_num_steps": 20, "warmup_type": "linear", "cos_min_ratio": 0.1}},
  "model": {"type": "gpt2", "preset": "custom", "num_layers": 2, "num_heads": 4, "channels": 64},
  "data": {"source": "addition", "addition": {"digits": 3, "examples_per_row": 4}},
  "steps_per_print": 100,
  "backend": "local",
  "ranks": 4,
  "steps": 1800,
  "eval_interval": 300
}
)";

// Damerau-Levenshtein distance in its optimal-string-alignment form: an insertion, a deletion, a substitution
// or a swap of two adjacent characters ("stgae") costs one.
size_t edit_distance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// The last component of a dotted key: what a typo is made in.
absl::string_view last_component(absl::string_view key) {
  const size_t dot = key.rfind('.');
  return dot == absl::string_view::npos ? key : key.substr(dot + 1);
}

absl::Status bad_type(absl::string_view key, absl::string_view expected, const json& value) {
  return absl::InvalidArgumentError(absl::StrCat(key, ": expected ", expected, ", got ", value.dump()));
}

// JSON value -> field, naming the key when the type is wrong. Integers may be written as 5e8.
absl::Status convert(const json& v, absl::string_view key, int64_t& out) {
  if (!v.is_number() || std::floor(v.get<double>()) != v.get<double>() || std::abs(v.get<double>()) > 9e18) {
    return bad_type(key, "an integer", v);
  }
  out = v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>();
  return absl::OkStatus();
}
absl::Status convert(const json& v, absl::string_view key, int& out) {
  int64_t wide = 0;
  ZERO_RETURN_IF_ERROR(convert(v, key, wide));
  if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max()) {
    return bad_type(key, "a 32-bit integer", v);
  }
  out = static_cast<int>(wide);
  return absl::OkStatus();
}
absl::Status convert(const json& v, absl::string_view key, uint64_t& out) {
  int64_t wide = 0;
  ZERO_RETURN_IF_ERROR(convert(v, key, wide));
  if (wide < 0) return bad_type(key, "a non-negative integer", v);
  out = static_cast<uint64_t>(wide);
  return absl::OkStatus();
}
absl::Status convert(const json& v, absl::string_view key, std::optional<int64_t>& out) {
  int64_t value = 0;
  ZERO_RETURN_IF_ERROR(convert(v, key, value));
  out = value;
  return absl::OkStatus();
}
absl::Status convert(const json& v, absl::string_view key, double& out) {
  if (!v.is_number()) return bad_type(key, "a number", v);
  out = v.get<double>();
  return absl::OkStatus();
}
absl::Status convert(const json& v, absl::string_view key, bool& out) {
  if (!v.is_boolean()) return bad_type(key, "true or false", v);
  out = v.get<bool>();
  return absl::OkStatus();
}
absl::Status convert(const json& v, absl::string_view key, std::string& out) {
  if (!v.is_string()) return bad_type(key, "a string", v);
  out = v.get<std::string>();
  return absl::OkStatus();
}
absl::Status convert(const json& v, absl::string_view key, std::vector<int64_t>& out) {
  if (!v.is_array()) return bad_type(key, "an array of integers", v);
  out.assign(v.size(), 0);
  for (size_t i = 0; i < v.size(); ++i) {
    if (!convert(v[i], key, out[i]).ok()) return bad_type(key, "an array of integers", v);
  }
  return absl::OkStatus();
}
absl::Status convert(const json& v, absl::string_view key, std::vector<double>& out) {
  if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_number(); })) {
    return bad_type(key, "an array of numbers", v);
  }
  out = v.get<std::vector<double>>();
  return absl::OkStatus();
}

constexpr std::array<absl::string_view, 4> kOptimizerTypes = {"Adam", "AdamW", "Lamb", "SGD"};

// DeepSpeed keys for what zero does not have, refused with the reason; and zero's renamed keys.
const std::map<std::string, std::string, std::less<>> kKeysNotTaken = {
    {"activation_checkpointing",
     "DeepSpeed's; model.recompute has every GPT-2 block recompute its activations in "
     "backward"},
    {"communication_data_type", "DeepSpeed's; gradients are reduced in the training precision"},
    {"log_interval", "renamed steps_per_print, DeepSpeed's name"},
};

// Reads dotted keys out of the config, remembering each one asked for, so that whatever the file holds
// beyond them can be named as unknown.
class KeyReader {
 public:
  explicit KeyReader(const json& root) : root_(root) {}

  // Leaves `out` at its default when the key is absent.
  template <typename T>
  absl::Status read(absl::string_view key, T& out) {
    known_.insert(std::string(key));
    defaults_.emplace(key, default_as_json(out));
    const json* node = &root_;
    std::string walked;
    for (absl::string_view part : absl::StrSplit(key, '.')) {
      if (!node->is_object()) return bad_type(walked, "an object", *node);
      const auto it = node->find(std::string(part));
      if (it == node->end()) return absl::OkStatus();
      node = &*it;
      walked = walked.empty() ? std::string(part) : absl::StrCat(walked, ".", part);
    }
    return convert(*node, key, out);
  }

  // A DeepSpeed key for a choice zero always makes one way: accepted with that value, refused with
  // another, saying why.
  template <typename T>
  absl::Status read_fixed(absl::string_view key, const T& always, absl::string_view why) {
    T value = always;
    ZERO_RETURN_IF_ERROR(read(key, value));
    if (value == always) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(key, " = ", json(value).dump(), ": zero always runs as ",
                                                   json(always).dump(), " (", why, "); remove the key"));
  }

  // A DeepSpeed section zero has no use for (a logger, a profiler): accepted, whatever it holds, while
  // its `enabled` is false.
  absl::Status read_disabled_section(absl::string_view section, absl::string_view why) {
    ZERO_RETURN_IF_ERROR(read_fixed(absl::StrCat(section, ".enabled"), false, why));
    accept_section(section);
    return absl::OkStatus();
  }

  // A DeepSpeed key, or a whole section, that changes nothing here: accepted with any value.
  void accept(absl::string_view key) {
    known_.insert(std::string(key));
    any_value_.insert(std::string(key));
  }
  void accept_section(absl::string_view section) { known_sections_.insert(std::string(section)); }

  // Every key in the tree, and those whose "auto" take_auto_values took out of it, is one zero reads.
  absl::Status check_no_unknown_keys(const std::vector<std::string>& auto_keys) const {
    ZERO_RETURN_IF_ERROR(check_object(root_, ""));
    for (const std::string& key : auto_keys) ZERO_RETURN_IF_ERROR(check_key(key, json("auto")));
    return absl::OkStatus();
  }

  KeyFacts facts(const std::string& key) const {
    const auto it = defaults_.find(key);
    return {.takes_any_value = any_value_.contains(key) || in_known_section(key),
            .default_value = it == defaults_.end() ? std::nullopt : it->second};
  }

 private:
  template <typename T>
  static std::optional<json> default_as_json(const T& value) {
    return json(value);
  }
  static std::optional<json> default_as_json(const std::optional<int64_t>&) { return std::nullopt; }  // derived

  bool in_known_section(const std::string& key) const {
    return absl::c_any_of(known_sections_,
                          [&](const std::string& s) { return key == s || absl::StartsWith(key, s + "."); });
  }
  bool is_parent(const std::string& key) const {
    return absl::c_any_of(known_, [&](const std::string& k) { return absl::StartsWith(k, key + "."); });
  }

  absl::Status check_object(const json& object, const std::string& prefix) const {
    for (const auto& [name, value] : object.items()) {
      const std::string key = prefix.empty() ? name : absl::StrCat(prefix, ".", name);
      ZERO_RETURN_IF_ERROR(is_parent(key) && value.is_object() ? check_object(value, key) : check_key(key, value));
    }
    return absl::OkStatus();
  }

  absl::Status check_key(const std::string& key, const json& value) const {
    if (known_.contains(key) || in_known_section(key)) return absl::OkStatus();
    if (const auto it = kKeysNotTaken.find(key); it != kKeysNotTaken.end()) {
      return absl::InvalidArgumentError(absl::StrCat("zero does not take '", key, "': ", it->second));
    }
    if (is_parent(key)) return bad_type(key, "an object", value);
    return unknown_key(key);
  }

  absl::Status unknown_key(const std::string& key) const {
    const std::optional<std::string> near = closest(key);
    if (near) return absl::InvalidArgumentError(absl::StrCat("unknown key '", key, "'; did you mean '", *near, "'?"));
    return absl::InvalidArgumentError(
        absl::StrCat("unknown key '", key, "'; remove it (README's config reference lists the keys zero-train takes)"));
  }

  // The known key or section whose last component is a typo away from `key`'s: within a Damerau-Levenshtein
  // distance of max(2, length / 4) and short of retyping it whole, nearest first, then nearest in full. None
  // beyond that: a far suggestion ("sparse_attention" -> "data.addition") sends the user the wrong way.
  std::optional<std::string> closest(const std::string& key) const {
    std::set<std::string> candidates(known_sections_.begin(), known_sections_.end());
    for (const std::string& k : known_) {
      for (size_t dot = k.find('.'); dot != std::string::npos; dot = k.find('.', dot + 1))
        candidates.insert(k.substr(0, dot));
      candidates.insert(k);
    }
    const absl::string_view typed = last_component(key);
    if (typed.empty()) return std::nullopt;
    const size_t threshold = std::min(std::max<size_t>(2, typed.size() / 4), typed.size() - 1);
    std::optional<std::string> best;
    std::pair<size_t, size_t> best_distance;
    for (const std::string& c : candidates) {
      const std::pair<size_t, size_t> distance = {edit_distance(typed, last_component(c)), edit_distance(key, c)};
      if (distance.first <= threshold && (!best || distance < best_distance)) {
        best = c;
        best_distance = distance;
      }
    }
    return best;
  }

  const json& root_;
  std::set<std::string> known_;
  std::set<std::string> any_value_;                      // accept's keys
  std::set<std::string> known_sections_;                 // anything inside is accepted
  std::map<std::string, std::optional<json>> defaults_;  // read's keys, at the value they have when absent
};

// DeepSpeed keys a config may carry that ask nothing zero does not do anyway.
absl::Status read_deepspeed_keys_zero_ignores(KeyReader& r) {
  // Choices zero always makes one way: accepted at that value.
  ZERO_RETURN_IF_ERROR(r.read_fixed("zero_optimization.contiguous_gradients", true,
                                    "backward writes every gradient into its unit's flat bucket"));
  ZERO_RETURN_IF_ERROR(
      r.read_fixed("zero_optimization.reduce_scatter", true, "stages 1-3 reduce-scatter each unit's gradients"));
  ZERO_RETURN_IF_ERROR(r.read_fixed("zero_optimization.allgather_partitions", true,
                                    "the updated slices of every unit kept whole are allgathered after the update"));
  ZERO_RETURN_IF_ERROR(r.read_fixed("zero_optimization.round_robin_gradients", false,
                                    "it spreads ZeRO-Offload's copies to host memory over the ranks, and zero's each "
                                    "copy only the rank's own slice of a unit, as soon as it is reduced"));
  const absl::string_view predivided = "each rank's gradient is divided by N x accumulation before the reduction";
  ZERO_RETURN_IF_ERROR(r.read_fixed("prescale_gradients", false, predivided));
  ZERO_RETURN_IF_ERROR(r.read_fixed("gradient_predivide_factor", 1.0, predivided));
  // Loggers and profilers: metrics go to metrics_path as JSON lines, phase times with wall_clock_breakdown.
  for (absl::string_view section : {"tensorboard", "wandb", "csv_monitor", "comms_logger", "flops_profiler", "amp"}) {
    ZERO_RETURN_IF_ERROR(r.read_disabled_section(
        section, section == "amp" ? "bf16.enabled or fp16.enabled choose the precision"
                                  : "metrics go to metrics_path; wall_clock_breakdown times the phases"));
  }
  // Keys that change nothing here, whatever their value.
  r.accept("zero_optimization.sub_group_size");  // the optimizer steps one flat unit's slice at a time
  // export_path gathers the whole model from every stage; the second is the first's old name.
  r.accept("zero_optimization.stage3_gather_16bit_weights_on_model_save");
  r.accept("zero_optimization.stage3_gather_fp16_weights_on_model_save");
  // DeepSpeed's choice of torch.optim.Adam/AdamW over its fused kernel: the same algorithm, which zero's
  // Adam follows either way (torch's formulas).
  r.accept("optimizer.params.torch_adam");
  // Host offload's transfers always use page-locked buffers; NVMe offload's bypass the page cache (O_DIRECT).
  r.accept("zero_optimization.offload_optimizer.pin_memory");
  r.accept("zero_optimization.offload_param.pin_memory");
  r.accept("zero_allow_untested_optimizer");  // every optimizer zero has is sharded
  // Tuning of DeepSpeed's NVMe swapper that zero's has no counterpart for: parameter shards are paged one unit at
  // a time as their gathers need them, and one I/O thread per rank moves whole tensors.
  for (absl::string_view key : {"offload_param.buffer_count", "offload_param.buffer_size", "offload_param.max_in_cpu",
                                "offload_optimizer.fast_init"}) {
    r.accept(absl::StrCat("zero_optimization.", key));
  }
  r.accept_section("aio");
  ZERO_RETURN_IF_ERROR(r.read_fixed("fp16.auto_cast", false, "the model computes in the training precision itself"));
  ZERO_RETURN_IF_ERROR(
      r.read_fixed("fp16.consecutive_hysteresis", false, "hysteresis counts overflows since the scale last changed"));
  ZERO_RETURN_IF_ERROR(
      r.read_fixed("fp16.fp16_master_weights_and_grads", false,
                   "it keeps fp32 master weights and optimizer state and steps them in fp32; DeepSpeed "
                   "takes fp16 ones only with ZeRO-Offload's CPU Adam at stage 2"));
  ZERO_RETURN_IF_ERROR(r.read_fixed("zero_optimization.cpu_offload", false,
                                    "it is DeepSpeed's old name for zero_optimization.offload_optimizer.device = cpu; "
                                    "set offload_optimizer.device = cpu instead (an engine on a GPU)"));
  // Gathered units alive are bounded by stage3_max_live_parameters, and a unit kept for a reuse within
  // them holds no more copies than prefetch would: freeing it earlier would only gather it again.
  r.accept("zero_optimization.stage3_max_reuse_distance");
  return absl::OkStatus();
}

absl::Status read_deepspeed_keys(KeyReader& r, TrainConfig& c) {
  ZERO_RETURN_IF_ERROR(r.read("train_batch_size", c.train_batch_size));
  ZERO_RETURN_IF_ERROR(r.read("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu));
  ZERO_RETURN_IF_ERROR(r.read("gradient_accumulation_steps", c.gradient_accumulation_steps));
  ZERO_RETURN_IF_ERROR(r.read("gradient_clipping", c.gradient_clipping));
  ZERO_RETURN_IF_ERROR(r.read("steps_per_print", c.steps_per_print));
  ZERO_RETURN_IF_ERROR(r.read("wall_clock_breakdown", c.wall_clock_breakdown));
  ZeroOptimization& z = c.zero_optimization;
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.stage", z.stage));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.reduce_bucket_size", z.reduce_bucket_size));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.allgather_bucket_size", z.allgather_bucket_size));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.stage3_max_live_parameters", z.stage3_max_live_parameters));
  ZERO_RETURN_IF_ERROR(
      r.read("zero_optimization.stage3_param_persistence_threshold", z.stage3_param_persistence_threshold));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.overlap_comm", z.overlap_comm));
  ZERO_RETURN_IF_ERROR(read_deepspeed_keys_zero_ignores(r));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.offload_optimizer.device", z.offload_optimizer.device));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.offload_optimizer.nvme_path", z.offload_optimizer.nvme_path));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.offload_optimizer.buffer_count", z.optimizer_swap.buffer_count));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.offload_optimizer.pipeline_read", z.optimizer_swap.pipeline_read));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.offload_optimizer.pipeline_write", z.optimizer_swap.pipeline_write));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.offload_param.device", z.offload_param.device));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.offload_param.nvme_path", z.offload_param.nvme_path));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.no_sync", z.no_sync));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.wrap_min_params", z.wrap_min_params));
  ZERO_RETURN_IF_ERROR(r.read("zero_optimization.delayed_update_after", z.delayed_update_after));
  ZERO_RETURN_IF_ERROR(r.read("bf16.enabled", c.bf16));
  ZERO_RETURN_IF_ERROR(r.read("fp16.enabled", c.fp16.enabled));
  ZERO_RETURN_IF_ERROR(r.read("fp16.loss_scale", c.fp16.loss_scale));
  ZERO_RETURN_IF_ERROR(r.read("fp16.initial_scale_power", c.fp16.initial_scale_power));
  ZERO_RETURN_IF_ERROR(r.read("fp16.loss_scale_window", c.fp16.loss_scale_window));
  ZERO_RETURN_IF_ERROR(r.read("fp16.hysteresis", c.fp16.hysteresis));
  ZERO_RETURN_IF_ERROR(r.read("fp16.min_loss_scale", c.fp16.min_loss_scale));
  OptimizerConfig& o = c.optimizer;
  ZERO_RETURN_IF_ERROR(r.read("optimizer.type", o.type));
  for (absl::string_view name : kOptimizerTypes) {
    if (absl::EqualsIgnoreCase(o.type, name)) o.type = std::string(name);  // DeepSpeed matches any case
  }
  ZERO_RETURN_IF_ERROR(r.read("optimizer.params.lr", o.lr));
  ZERO_RETURN_IF_ERROR(r.read("optimizer.params.betas", o.betas));
  ZERO_RETURN_IF_ERROR(r.read("optimizer.params.eps", o.eps));
  ZERO_RETURN_IF_ERROR(r.read("optimizer.params.weight_decay", o.weight_decay));
  ZERO_RETURN_IF_ERROR(r.read("optimizer.params.adam_w_mode", o.adam_w_mode));
  ZERO_RETURN_IF_ERROR(r.read("optimizer.params.momentum", o.momentum));
  ZERO_RETURN_IF_ERROR(r.read("optimizer.params.bias_correction", o.bias_correction));
  ZERO_RETURN_IF_ERROR(r.read("optimizer.params.max_coeff", o.max_coeff));
  ZERO_RETURN_IF_ERROR(r.read("optimizer.params.min_coeff", o.min_coeff));
  SchedulerConfig& s = c.scheduler;
  ZERO_RETURN_IF_ERROR(r.read("scheduler.type", s.type));
  if (absl::EqualsIgnoreCase(s.type, "none")) s.type.clear();  // zero's name for DeepSpeed's absent scheduler
  ZERO_RETURN_IF_ERROR(r.read("scheduler.params.warmup_min_lr", s.warmup_min_lr));
  ZERO_RETURN_IF_ERROR(r.read("scheduler.params.warmup_max_lr", s.warmup_max_lr));
  ZERO_RETURN_IF_ERROR(r.read("scheduler.params.warmup_num_steps", s.warmup_num_steps));
  ZERO_RETURN_IF_ERROR(r.read("scheduler.params.warmup_type", s.warmup_type));
  ZERO_RETURN_IF_ERROR(r.read("scheduler.params.total_num_steps", s.total_num_steps));
  ZERO_RETURN_IF_ERROR(r.read("scheduler.params.warmup_min_ratio", s.warmup_min_ratio));
  return r.read("scheduler.params.cos_min_ratio", s.cos_min_ratio);
}

absl::Status read_zero_train_keys(KeyReader& r, TrainConfig& c) {
  ZERO_RETURN_IF_ERROR(r.read("model.type", c.model.type));
  ZERO_RETURN_IF_ERROR(r.read("model.preset", c.model.preset));
  ZERO_RETURN_IF_ERROR(r.read("model.num_layers", c.model.num_layers));
  ZERO_RETURN_IF_ERROR(r.read("model.num_heads", c.model.num_heads));
  ZERO_RETURN_IF_ERROR(r.read("model.channels", c.model.channels));
  ZERO_RETURN_IF_ERROR(r.read("model.widths", c.model.widths));
  ZERO_RETURN_IF_ERROR(r.read("model.recompute", c.model.recompute));
  DataConfig& d = c.data;
  ZERO_RETURN_IF_ERROR(r.read("data.source", d.source));
  ZERO_RETURN_IF_ERROR(r.read("data.addition.digits", d.digits));
  ZERO_RETURN_IF_ERROR(r.read("data.addition.examples_per_row", d.examples_per_row));
  ZERO_RETURN_IF_ERROR(r.read("data.addition.train_rows", d.train_rows));
  ZERO_RETURN_IF_ERROR(r.read("data.addition.val_rows", d.val_rows));
  ZERO_RETURN_IF_ERROR(r.read("data.addition.seed", d.seed));
  ZERO_RETURN_IF_ERROR(r.read("data.tokens.train", d.train_glob));
  ZERO_RETURN_IF_ERROR(r.read("data.tokens.val", d.val_glob));
  ZERO_RETURN_IF_ERROR(r.read("data.tokens.seq_len", d.seq_len));
  ZERO_RETURN_IF_ERROR(r.read("data.tokens.vocab_size", d.vocab_size));
  ZERO_RETURN_IF_ERROR(r.read("data.blobs.features", d.blobs.features));
  ZERO_RETURN_IF_ERROR(r.read("data.blobs.classes", d.blobs.classes));
  ZERO_RETURN_IF_ERROR(r.read("data.blobs.noise", d.blobs.noise));
  ZERO_RETURN_IF_ERROR(r.read("data.blobs.train_rows", d.blobs.train_rows));
  ZERO_RETURN_IF_ERROR(r.read("data.blobs.val_rows", d.blobs.val_rows));
  ZERO_RETURN_IF_ERROR(r.read("data.blobs.seed", d.blobs.seed));
  ZERO_RETURN_IF_ERROR(r.read("backend", c.backend));
  ZERO_RETURN_IF_ERROR(r.read("device", c.device));
  ZERO_RETURN_IF_ERROR(r.read("tf32", c.tf32));
  ZERO_RETURN_IF_ERROR(r.read("ranks", c.ranks));
  ZERO_RETURN_IF_ERROR(r.read("memory_budget_mib", c.memory_budget_mib));
  ZERO_RETURN_IF_ERROR(r.read("steps", c.steps));
  ZERO_RETURN_IF_ERROR(r.read("eval_interval", c.eval_interval));
  ZERO_RETURN_IF_ERROR(r.read("eval_batches", c.eval_batches));
  ZERO_RETURN_IF_ERROR(r.read("seed", c.seed));
  ZERO_RETURN_IF_ERROR(r.read("metrics_path", c.metrics_path));
  ZERO_RETURN_IF_ERROR(r.read("plot_path", c.plot_path));
  ZERO_RETURN_IF_ERROR(r.read("init_from", c.init_from));
  ZERO_RETURN_IF_ERROR(r.read("export_path", c.export_path));
  ZERO_RETURN_IF_ERROR(r.read("checkpoint.dir", c.checkpoint.dir));
  ZERO_RETURN_IF_ERROR(r.read("checkpoint.interval", c.checkpoint.interval));
  ZERO_RETURN_IF_ERROR(r.read("checkpoint.keep_last", c.checkpoint.keep_last));
  return r.read("checkpoint.resume", c.checkpoint.resume);
}

// "key = value: rule" when cond fails.
template <typename T>
absl::Status require(bool cond, absl::string_view key, const T& value, absl::string_view rule) {
  if (cond) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " = ", value, ": ", rule));
}

bool one_of(const std::string& value, absl::Span<const absl::string_view> allowed) {
  return absl::c_linear_search(allowed, value);
}

// One of offload_optimizer and offload_param: "none"; "nvme" with a path, from an engine on the CPU; or, for the
// optimizer of an engine on a device, "cpu" (ZeRO-Offload).
absl::Status validate_offload_target(const std::string& key, const Offload& o, const std::string& device) {
  if (o.device == "cpu") {
    return require(device != "cpu", key + ".device", o.device,
                   "the engine is on the CPU (device = cpu), where its states are in host memory already; use none, "
                   "or nvme to move them to files");
  }
  ZERO_RETURN_IF_ERROR(require(one_of(o.device, {"none", "nvme"}), key + ".device", o.device, "use none, cpu or nvme"));
  ZERO_RETURN_IF_ERROR(require(o.device != "nvme" || device == "cpu", key + ".device", o.device,
                               "offloading from a GPU is not built; use device = cpu, or none"));
  return require(o.device != "nvme" || !o.nvme_path.empty(), key + ".nvme_path", "\"\"",
                 "name a directory on the drive to hold the files");
}

absl::Status validate_offload(const TrainConfig& c) {
  const ZeroOptimization& z = c.zero_optimization;
  ZERO_RETURN_IF_ERROR(validate_offload_target("zero_optimization.offload_optimizer", z.offload_optimizer, c.device));
  ZERO_RETURN_IF_ERROR(validate_offload_target("zero_optimization.offload_param", z.offload_param, c.device));
  ZERO_RETURN_IF_ERROR(require(z.offload_param.device == "none" || StagePolicy(z.stage).partitions_params(),
                               "zero_optimization.offload_param.device", z.offload_param.device,
                               absl::StrCat("offload_param moves the parameter shards of stage 3, and stage ", z.stage,
                                            " keeps every parameter whole; use zero_optimization.stage = 3, or none")));
  return require(z.offload_param.device != "cpu" || z.offload_optimizer.device == "cpu",
                 "zero_optimization.offload_param.device", z.offload_param.device,
                 "the shards in host memory are written there by the optimizer: set offload_optimizer.device = cpu "
                 "too");
}

absl::Status validate_deepspeed_keys(const TrainConfig& c) {
  for (const auto& [key, value] : {std::pair{"train_batch_size", c.train_batch_size},
                                   {"train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu},
                                   {"gradient_accumulation_steps", c.gradient_accumulation_steps}}) {
    if (value) ZERO_RETURN_IF_ERROR(require(*value >= 1, key, *value, "must be at least 1"));
  }
  ZERO_RETURN_IF_ERROR(
      require(c.gradient_clipping >= 0, "gradient_clipping", c.gradient_clipping, "must be >= 0 (0 = off)"));
  const ZeroOptimization& z = c.zero_optimization;
  ZERO_RETURN_IF_ERROR(
      require(StagePolicy::valid(z.stage), "zero_optimization.stage", z.stage, "the stage is 0, 1, 2 or 3"));
  ZERO_RETURN_IF_ERROR(require(z.reduce_bucket_size >= 0, "zero_optimization.reduce_bucket_size", z.reduce_bucket_size,
                               "must be >= 0 elements (0 = every unit reduced alone)"));
  ZERO_RETURN_IF_ERROR(require(z.allgather_bucket_size > 0, "zero_optimization.allgather_bucket_size",
                               z.allgather_bucket_size, "must be a positive number of elements"));
  ZERO_RETURN_IF_ERROR(require(z.stage3_prefetch_bucket_size >= 0, "zero_optimization.stage3_prefetch_bucket_size",
                               z.stage3_prefetch_bucket_size, "must be >= 0 elements (0 = no prefetch)"));
  ZERO_RETURN_IF_ERROR(require(z.stage3_max_live_parameters > 0, "zero_optimization.stage3_max_live_parameters",
                               z.stage3_max_live_parameters, "must be a positive number of elements"));
  ZERO_RETURN_IF_ERROR(require(z.stage3_param_persistence_threshold >= 0,
                               "zero_optimization.stage3_param_persistence_threshold",
                               z.stage3_param_persistence_threshold, "must be >= 0 elements"));
  ZERO_RETURN_IF_ERROR(validate_offload(c));
  if (c.bf16 && c.fp16.enabled) {
    return absl::InvalidArgumentError("bf16.enabled and fp16.enabled are both true; enable at most one");
  }
  const Fp16& f = c.fp16;
  ZERO_RETURN_IF_ERROR(require(f.loss_scale >= 0, "fp16.loss_scale", f.loss_scale, "must be >= 0 (0 = dynamic)"));
  ZERO_RETURN_IF_ERROR(require(f.initial_scale_power >= 0 && f.initial_scale_power <= 62, "fp16.initial_scale_power",
                               f.initial_scale_power, "must be in [0, 62]"));
  ZERO_RETURN_IF_ERROR(
      require(f.loss_scale_window >= 1, "fp16.loss_scale_window", f.loss_scale_window, "must be >= 1"));
  ZERO_RETURN_IF_ERROR(require(f.hysteresis >= 1, "fp16.hysteresis", f.hysteresis, "must be >= 1"));
  ZERO_RETURN_IF_ERROR(require(f.min_loss_scale > 0, "fp16.min_loss_scale", f.min_loss_scale, "must be positive"));
  const OptimizerConfig& o = c.optimizer;
  ZERO_RETURN_IF_ERROR(
      require(one_of(o.type, kOptimizerTypes), "optimizer.type", o.type, "use Adam, AdamW, Lamb or SGD (in any case)"));
  ZERO_RETURN_IF_ERROR(require(o.lr >= 0, "optimizer.params.lr", o.lr, "must be >= 0"));
  ZERO_RETURN_IF_ERROR(
      require(o.betas.size() == 2 && o.betas[0] >= 0 && o.betas[0] < 1 && o.betas[1] >= 0 && o.betas[1] < 1,
              "optimizer.params.betas", absl::StrJoin(o.betas, ", "), "must be two numbers in [0, 1)"));
  ZERO_RETURN_IF_ERROR(require(o.eps > 0, "optimizer.params.eps", o.eps, "must be positive"));
  ZERO_RETURN_IF_ERROR(require(o.weight_decay >= 0, "optimizer.params.weight_decay", o.weight_decay, "must be >= 0"));
  ZERO_RETURN_IF_ERROR(require(o.momentum >= 0, "optimizer.params.momentum", o.momentum, "must be >= 0"));
  ZERO_RETURN_IF_ERROR(require(o.min_coeff >= 0 && o.min_coeff <= o.max_coeff, "optimizer.params.min_coeff/max_coeff",
                               absl::StrCat(o.min_coeff, "/", o.max_coeff),
                               "the trust ratio's range needs 0 <= min_coeff <= max_coeff"));
  const SchedulerConfig& s = c.scheduler;
  ZERO_RETURN_IF_ERROR(require(one_of(s.type, {"", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}), "scheduler.type",
                               s.type, "use WarmupLR, WarmupDecayLR, WarmupCosineLR or none"));
  ZERO_RETURN_IF_ERROR(require(one_of(s.warmup_type, {"log", "linear"}), "scheduler.params.warmup_type", s.warmup_type,
                               "use log or linear"));
  ZERO_RETURN_IF_ERROR(
      require(s.warmup_num_steps >= 0, "scheduler.params.warmup_num_steps", s.warmup_num_steps, "must be >= 0"));
  ZERO_RETURN_IF_ERROR(require(s.warmup_min_lr >= 0 && s.warmup_max_lr >= 0, "scheduler.params.warmup_min_lr/max_lr",
                               absl::StrCat(s.warmup_min_lr, "/", s.warmup_max_lr), "must be >= 0"));
  const int64_t total = s.total_num_steps > 0 ? s.total_num_steps : c.steps;
  const bool decays = s.type == "WarmupDecayLR" || s.type == "WarmupCosineLR";
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);  // DeepSpeed's floor
  if (!decays || total > warmup) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      s.total_num_steps > 0 ? absl::StrCat("scheduler.params.total_num_steps = ", total)
                            : absl::StrCat("steps = ", total, " (scheduler.params.total_num_steps defaults to it)"),
      ": ", s.type, " decays after its warmup, so it must exceed max(2, scheduler.params.warmup_num_steps = ",
      s.warmup_num_steps, ") = ", warmup, "; raise it, shorten the warmup, or set scheduler.type = none"));
}

absl::Status validate_gpt2(const ModelConfig& m, const DataConfig& d) {
  ZERO_RETURN_IF_ERROR(require(one_of(d.source, {"addition", "tokens"}), "data.source", d.source,
                               "gpt2 reads token sequences: use addition or tokens (blobs is for model.type = mlp)"));
  if (m.preset != "custom") {
    absl::StatusOr<Gpt2Config> preset = Gpt2Config::preset(m.preset);
    if (!preset.ok())
      return absl::InvalidArgumentError(absl::StrCat("model.preset: ", preset.status().message(), " (or custom)"));
  }
  ZERO_RETURN_IF_ERROR(require(m.num_layers >= 1, "model.num_layers", m.num_layers, "must be at least 1"));
  ZERO_RETURN_IF_ERROR(require(m.num_heads >= 1, "model.num_heads", m.num_heads, "must be at least 1"));
  return require(m.channels >= 1 && m.channels % m.num_heads == 0, "model.channels", m.channels,
                 absl::StrCat("must be a positive multiple of model.num_heads (", m.num_heads, ")"));
}

absl::Status validate_mlp(const ModelConfig& m, const DataConfig& d) {
  ZERO_RETURN_IF_ERROR(require(d.source == "blobs", "data.source", d.source,
                               "the mlp reads labelled features: use blobs (addition and tokens are for gpt2)"));
  ZERO_RETURN_IF_ERROR(require(!m.recompute, "model.recompute", "true",
                               "only GPT-2's blocks recompute their activations; the mlp saves its own"));
  const std::string widths = absl::StrCat("[", absl::StrJoin(m.widths, ", "), "]");
  ZERO_RETURN_IF_ERROR(
      require(m.widths.size() >= 2 && std::all_of(m.widths.begin(), m.widths.end(), [](int64_t w) { return w >= 1; }),
              "model.widths", widths, "must be two or more positive widths [D, hidden..., K]"));
  if (m.widths.front() != d.blobs.features || m.widths.back() != d.blobs.classes) {
    return absl::InvalidArgumentError(absl::StrCat("model.widths = ", widths, " must start with data.blobs.features (",
                                                   d.blobs.features, ") and end with data.blobs.classes (",
                                                   d.blobs.classes, "); change one to match the other"));
  }
  return absl::OkStatus();
}

absl::Status validate_data(const DataConfig& d) {
  ZERO_RETURN_IF_ERROR(require(one_of(d.source, {"addition", "tokens", "blobs"}), "data.source", d.source,
                               "use addition, tokens or blobs"));
  ZERO_RETURN_IF_ERROR(require(d.digits >= 1 && d.digits <= 9, "data.addition.digits", d.digits, "must be 1 to 9"));
  ZERO_RETURN_IF_ERROR(
      require(d.examples_per_row >= 1, "data.addition.examples_per_row", d.examples_per_row, "must be >= 1"));
  ZERO_RETURN_IF_ERROR(require(d.train_rows >= 1, "data.addition.train_rows", d.train_rows, "must be >= 1"));
  ZERO_RETURN_IF_ERROR(require(d.val_rows >= 1, "data.addition.val_rows", d.val_rows, "must be >= 1"));
  if (d.source == "tokens") {
    ZERO_RETURN_IF_ERROR(
        require(!d.train_glob.empty(), "data.tokens.train", "\"\"", "name the training shards (a glob)"));
    ZERO_RETURN_IF_ERROR(
        require(!d.val_glob.empty(), "data.tokens.val", "\"\"", "name the validation shards (a glob)"));
  }
  ZERO_RETURN_IF_ERROR(require(d.seq_len >= 1, "data.tokens.seq_len", d.seq_len, "must be >= 1"));
  ZERO_RETURN_IF_ERROR(require(d.vocab_size >= 1 && d.vocab_size <= 65536, "data.tokens.vocab_size", d.vocab_size,
                               "must be 1 to 65536 (shards store uint16 tokens)"));
  const BlobsKeys& b = d.blobs;
  ZERO_RETURN_IF_ERROR(require(b.features >= 1, "data.blobs.features", b.features, "must be >= 1"));
  ZERO_RETURN_IF_ERROR(require(b.classes >= 2, "data.blobs.classes", b.classes, "must be >= 2"));
  ZERO_RETURN_IF_ERROR(require(b.noise >= 0, "data.blobs.noise", b.noise, "must be >= 0"));
  ZERO_RETURN_IF_ERROR(require(b.train_rows >= 1, "data.blobs.train_rows", b.train_rows, "must be >= 1"));
  return require(b.val_rows >= 1, "data.blobs.val_rows", b.val_rows, "must be >= 1");
}

absl::Status validate_model_and_data(const TrainConfig& c) {
  ZERO_RETURN_IF_ERROR(require(one_of(c.model.type, {"gpt2", "mlp"}), "model.type", c.model.type, "use gpt2 or mlp"));
  ZERO_RETURN_IF_ERROR(validate_data(c.data));
  return c.model.type == "mlp" ? validate_mlp(c.model, c.data) : validate_gpt2(c.model, c.data);
}

absl::Status validate_run(const TrainConfig& c) {
  ZERO_RETURN_IF_ERROR(
      require(one_of(c.backend, {"local", "mpi", "nccl"}), "backend", c.backend, "use local, mpi or nccl"));
  ZERO_RETURN_IF_ERROR(
      require(one_of(c.device, {"cpu", "cuda", "sim"}), "device", c.device,
              "use cpu, cuda, or sim (the simulated GPU: CUDA's ordering rules, checked, on the CPU)"));
  ZERO_RETURN_IF_ERROR(require(c.backend != "nccl" || c.device == "cuda", "backend", c.backend,
                               "nccl moves GPU memory: set device = cuda (one GPU per rank)"));
  ZERO_RETURN_IF_ERROR(require(c.backend != "mpi" || c.device == "cpu", "device", c.device,
                               "with mpi the ranks train on the CPU; use backend = nccl for one process per GPU"));
  ZERO_RETURN_IF_ERROR(require(!c.tf32 || c.device == "cuda", "tf32", "true",
                               absl::StrCat("TF32 runs on CUDA's tensor cores; device ", c.device,
                                            " computes fp32 GEMMs exactly: set device = cuda, or tf32 false")));
  ZERO_RETURN_IF_ERROR(require(!c.tf32 || (!c.bf16 && !c.fp16.enabled), "tf32", "true",
                               "TF32 changes fp32 GEMMs only, and a bf16/fp16 run computes its GEMMs in that precision "
                               "on the tensor cores already: set tf32 false"));
#ifndef ZERO_HAS_CUDA
  ZERO_RETURN_IF_ERROR(require(c.device != "cuda", "device", c.device,
                               "this zero-train was built without CUDA (configure with -DZERO_WITH_CUDA=ON)"));
#endif
  ZERO_RETURN_IF_ERROR(require(c.ranks >= 1, "ranks", c.ranks, "must be at least 1"));
  ZERO_RETURN_IF_ERROR(require(c.backend != "local" || c.ranks <= kMaxLocalRanks, "ranks", c.ranks,
                               absl::StrCat("local ranks are threads of this process (two each), at most ",
                                            kMaxLocalRanks, "; start more as processes: mpirun --backend=mpi")));
  ZERO_RETURN_IF_ERROR(
      require(c.memory_budget_mib >= 0, "memory_budget_mib", c.memory_budget_mib, "must be >= 0 (0 = none)"));
  ZERO_RETURN_IF_ERROR(require(c.memory_budget_mib <= (std::numeric_limits<int64_t>::max() >> 20), "memory_budget_mib",
                               c.memory_budget_mib, "is more bytes than an int64 counts"));
  ZERO_RETURN_IF_ERROR(require(c.steps >= 1, "steps", c.steps, "must be at least 1"));
  ZERO_RETURN_IF_ERROR(
      require(c.eval_interval >= 0, "eval_interval", c.eval_interval, "must be >= 0 (0 = at the end only)"));
  ZERO_RETURN_IF_ERROR(require(c.eval_batches >= 1, "eval_batches", c.eval_batches, "must be at least 1"));
  ZERO_RETURN_IF_ERROR(require(c.steps_per_print >= 1, "steps_per_print", c.steps_per_print, "must be at least 1"));
  const CheckpointConfig& k = c.checkpoint;
  ZERO_RETURN_IF_ERROR(
      require(k.interval >= 0, "checkpoint.interval", k.interval, "must be >= 0 (0 = at the end only)"));
  ZERO_RETURN_IF_ERROR(require(k.keep_last >= 0, "checkpoint.keep_last", k.keep_last, "must be >= 0 (0 = keep all)"));
  ZERO_RETURN_IF_ERROR(require(!k.dir.empty() || !one_of(k.resume, {"latest", "auto"}), "checkpoint.resume", k.resume,
                               "resuming from the latest checkpoint needs checkpoint.dir"));
  ZERO_RETURN_IF_ERROR(require(c.plot_path.empty() || !c.metrics_path.empty(), "plot_path", c.plot_path,
                               "the curve is drawn from the metrics file: set metrics_path too"));
  const bool gpt2_weights = c.init_from.empty() && c.export_path.empty();
  return require(gpt2_weights || c.model.type == "gpt2", "init_from/export_path", c.model.type,
                 "safetensors import and export are for gpt2 models");
}

// `--key.path=null` removes the key, so that its default applies: null is no key's value, and a file's key
// could not be unset otherwise. A key the tree does not hold is left absent.
void remove_key(json& root, absl::string_view path) {
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  json* node = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node->is_object() || !node->contains(parts[i])) return;
    node = &(*node)[parts[i]];
  }
  if (node->is_object()) node->erase(parts.back());
}

// Sets `key.path` = value in the tree, creating objects on the way. The value is JSON if it parses, else a string.
absl::Status apply_override(json& root, absl::string_view override_arg) {
  const std::vector<absl::string_view> kv = absl::StrSplit(override_arg, absl::MaxSplits('=', 1));
  if (kv.size() != 2 || kv[0].empty()) {
    return absl::InvalidArgumentError(absl::StrCat("override '", override_arg, "': write it as key.path=value"));
  }
  json value = json::parse(kv[1], nullptr, /*allow_exceptions=*/false);
  if (value.is_null()) {
    remove_key(root, kv[0]);
    return absl::OkStatus();
  }
  json* node = &root;
  std::string walked;
  for (absl::string_view part : absl::StrSplit(kv[0], '.')) {
    if (!node->is_object()) return bad_type(walked, "an object", *node);
    node = &(*node)[std::string(part)];
    walked = walked.empty() ? std::string(part) : absl::StrCat(walked, ".", part);
    if (node->is_null()) *node = json::object();
  }
  *node = value.is_discarded() ? json(std::string(kv[1])) : std::move(value);
  return absl::OkStatus();
}

// The first key that an object of a JSON text holds twice ("a.b" for b twice inside a), or "". JSON
// parsers keep the last of them, so the first would be silently ignored.
class DuplicateKeyFinder {
 public:
  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) objects_.push_back({});
    if (event == json::parse_event_t::object_end) objects_.pop_back();
    if (event == json::parse_event_t::key && duplicate_.empty()) {
      Object& o = objects_.back();
      o.key = parsed.get<std::string>();
      if (!o.seen.insert(o.key).second) duplicate_ = path();
    }
    return true;
  }
  const std::string& duplicate() const { return duplicate_; }

 private:
  struct Object {
    std::set<std::string> seen;
    std::string key;  // the key being read
  };
  std::string path() const {
    std::string p;
    for (const Object& o : objects_) absl::StrAppend(&p, p.empty() ? "" : ".", o.key);
    return p;
  }
  std::vector<Object> objects_;
  std::string duplicate_;
};

// `text` as a JSON object, or an error saying at which line and column it stops being one.
absl::StatusOr<json> parse_json_object(const std::string& text) {
  json root;
  DuplicateKeyFinder duplicates;
  try {
    root = json::parse(text, std::ref(duplicates));
  } catch (const json::out_of_range& e) {  // a number beyond double's range
    std::string what = e.what();
    if (const size_t space = what.find("] "); space != std::string::npos) what = what.substr(space + 2);
    return absl::InvalidArgumentError(absl::StrCat("the config holds a value JSON cannot carry: ", what));
  } catch (const json::parse_error& e) {
    const size_t end = std::min(text.size(), e.byte > 0 ? e.byte - 1 : 0);
    const size_t line_start = text.rfind('\n', end == 0 ? 0 : end - 1);
    const int64_t line = 1 + std::count(text.begin(), text.begin() + static_cast<ptrdiff_t>(end), '\n');
    const size_t column = end - (line_start == std::string::npos ? 0 : line_start + 1) + 1;
    std::string what = e.what();
    if (const size_t colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    return absl::InvalidArgumentError(
        absl::StrCat("the config is not valid JSON at line ", line, ", column ", column, ": ", what));
  }
  if (!root.is_object())
    return absl::InvalidArgumentError(absl::StrCat("the config is ", root.type_name(), ", not a JSON object ({...})"));
  if (!duplicates.duplicate().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the config sets ", duplicates.duplicate(), " twice; JSON keeps only the last, so remove one"));
  }
  return root;
}

}  // namespace

const char* default_config_json() { return kDefaultConfig; }

namespace {

// Whether an override sets `key` itself or an object that holds it.
bool overrides_set(const std::vector<std::string>& overrides, absl::string_view key) {
  return absl::c_any_of(overrides, [&](const std::string& o) {
    const absl::string_view set = absl::string_view(o).substr(0, o.find('='));
    return set == key || absl::StartsWith(key, absl::StrCat(set, "."));
  });
}

// The embedded default's 20-step warmup is sized for its 1800 steps: a shorter run (--steps=8 to try it)
// warms up for a tenth of itself instead, where a fixed 20 would outlast the decay. A warmup the user set
// is theirs, and one that does not fit stays an error.
void fit_default_warmup_to_the_run(const std::vector<std::string>& overrides, TrainConfig& c) {
  if (overrides_set(overrides, "scheduler.params.warmup_num_steps")) return;
  c.scheduler.warmup_num_steps = std::min(c.scheduler.warmup_num_steps, c.steps / 10);
}

enum class Source { kFile, kEmbeddedDefault };

absl::StatusOr<TrainConfig> parse_config(const std::string& text, const std::vector<std::string>& overrides,
                                         Source source) {
  ZERO_ASSIGN_OR_RETURN(json root, parse_json_object(text));
  for (const std::string& o : overrides) ZERO_RETURN_IF_ERROR(apply_override(root, o));
  const std::vector<std::string> auto_keys = take_auto_values(root);
  TrainConfig config;
  KeyReader reader(root);
  ZERO_RETURN_IF_ERROR(read_deepspeed_keys(reader, config));
  ZERO_RETURN_IF_ERROR(read_zero_train_keys(reader, config));
  ZERO_RETURN_IF_ERROR(reader.check_no_unknown_keys(auto_keys));
  ZERO_RETURN_IF_ERROR(fill_auto_values(
      auto_keys, [&](const std::string& key) { return reader.facts(key); }, config));
  if (source == Source::kEmbeddedDefault) fit_default_warmup_to_the_run(overrides, config);
  ZERO_RETURN_IF_ERROR(validate_deepspeed_keys(config));
  ZERO_RETURN_IF_ERROR(validate_model_and_data(config));
  ZERO_RETURN_IF_ERROR(validate_run(config));
  return config;
}

}  // namespace

absl::StatusOr<TrainConfig> parse_train_config(const std::string& text, const std::vector<std::string>& overrides) {
  return parse_config(text, overrides, Source::kFile);
}

absl::StatusOr<TrainConfig> parse_default_config(const std::vector<std::string>& overrides) {
  return parse_config(kDefaultConfig, overrides, Source::kEmbeddedDefault);
}

absl::StatusOr<BatchPlan> resolve_batch(const TrainConfig& c, int world_size) {
  const int64_t n = world_size;
  std::optional<int64_t> global = c.train_batch_size, micro = c.train_micro_batch_size_per_gpu,
                         accumulation = c.gradient_accumulation_steps;
  if (!global && !micro) {
    return absl::InvalidArgumentError(
        "set train_batch_size or train_micro_batch_size_per_gpu (any two of them and gradient_accumulation_steps "
        "determine the third)");
  }
  if (global && micro && !accumulation) accumulation = std::max<int64_t>(1, *global / (*micro * n));
  if (global && !micro) {
    accumulation = accumulation.value_or(1);
    micro = std::max<int64_t>(1, *global / (*accumulation * n));
  }
  if (!global) {
    accumulation = accumulation.value_or(1);
    global = *micro * *accumulation * n;
  }
  if (*global != *micro * *accumulation * n) {
    return absl::InvalidArgumentError(absl::StrCat("train_batch_size ", *global, " != train_micro_batch_size_per_gpu ",
                                                   *micro, " * gradient_accumulation_steps ", *accumulation,
                                                   " * ranks ", n, " (= ", *micro * *accumulation * n,
                                                   "); set two of the three batch keys and the third is derived"));
  }
  return BatchPlan{.train_batch_size = *global, .micro_batch = *micro, .accumulation_steps = *accumulation};
}

int optimizer_state_floats(const OptimizerConfig& optimizer) {
  if (optimizer.type == "SGD") return optimizer.momentum > 0 ? 1 : 0;
  return 2;
}

namespace {

// Elements in the largest gradient bucket the engine fills (ZeroConfig::gradient_buckets), every unit
// padded to a multiple of the ranks.
int64_t largest_bucket_numel(const std::vector<UnitSize>& units, const ZeroConfig& config, int world_size) {
  std::vector<int64_t> padded;
  for (const UnitSize& u : units) padded.push_back((u.numel + world_size - 1) / world_size * world_size);
  int64_t largest = 0;
  for (const std::vector<int>& bucket : config.gradient_buckets(padded)) {
    int64_t numel = 0;
    for (const int i : bucket) numel += padded[i];
    largest = std::max(largest, numel);
  }
  return largest;
}

DType training_precision(const TrainConfig& c) {
  return c.bf16 ? DType::kBF16 : c.fp16.enabled ? DType::kF16 : DType::kF32;
}

// shard/plan.h's input for `params` parameters over `world_size` ranks under the config's stage, precision,
// optimizer and offload.
PlanInput states_plan(const TrainConfig& c, int64_t params, int world_size) {
  const ZeroOptimization& z = c.zero_optimization;
  return {.params = params,
          .world_size = world_size,
          .stage = z.stage,
          .precision = training_precision(c),
          .optimizer_state_bytes = 4 * optimizer_state_floats(c.optimizer),
          .offload_optimizer = z.offload_optimizer.device == "nvme",
          .offload_param = z.offload_param.device == "nvme",
          .offload_optimizer_to_host = z.offload_optimizer.device == "cpu",
          .offload_param_to_host = z.offload_param.device == "cpu"};
}

}  // namespace

absl::Status check_machine_holds(const TrainConfig& c, const Gpt2Config& g, int world_size, int ranks_here,
                                 int64_t memory_bytes) {
  const double params = g.parameter_count();  // a shape that overflows int64 is as refused as one that does not fit
  const int64_t sample = int64_t{world_size} << 20;  // the formulas are linear in the parameters
  const ModelStateBytes per_rank = model_state_bytes(states_plan(c, sample, world_size));
  const int64_t in_host_memory = c.device == "cuda" ? per_rank.host_memory() : per_rank.total();
  const double needed = params * static_cast<double>(in_host_memory) / static_cast<double>(sample) * ranks_here;
  if (needed <= static_cast<double>(memory_bytes)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "the model (model.num_layers = %d, model.channels = %d, vocabulary %d) has %.3g parameters, whose states at "
      "stage %d need %s of host memory on the %d rank(s) of this machine, which has %s; make the model smaller, or "
      "spread it over more machines",
      g.num_layers, g.channels, g.vocab_size, params, c.zero_optimization.stage,
      needed < 9e18 ? format_bytes(static_cast<int64_t>(needed)) : absl::StrFormat("%.3g bytes", needed), ranks_here,
      format_bytes(memory_bytes)));
}

absl::StatusOr<ZeroConfig> engine_config(const TrainConfig& c, const BatchPlan& batch, int world_size,
                                         const std::vector<UnitSize>& units, Device device) {
  const ZeroOptimization& z = c.zero_optimization;
  ZeroConfig config;
  config.device = device;
  config.tf32 = c.tf32;
  config.stage = z.stage;
  config.no_sync = z.no_sync;
  config.wrap_min_params = z.wrap_min_params;
  config.delayed_update_after = z.delayed_update_after;
  config.precision = training_precision(c);
  config.loss_scaling = {.initial_scale = std::ldexp(1.0, c.fp16.initial_scale_power),
                         .window = c.fp16.loss_scale_window,
                         .hysteresis = c.fp16.hysteresis,
                         .min_scale = c.fp16.min_loss_scale,
                         .static_scale = c.fp16.loss_scale};
  // DeepSpeed counts bucket sizes in elements, the engine in bytes of the training dtype. Stage 0 packs
  // units into buckets up to reduce_bucket_size; stages 1-3 reduce-scatter and allgather one flat unit
  // per collective (so every rank's slice is contiguous), which allgather_bucket_size cannot change.
  // reduce_bucket_size 0, with which DeepSpeed reduces each gradient alone, is a cap of one element: no
  // two units share a bucket.
  const int64_t element_bytes = static_cast<int64_t>(dtype_size(config.precision));
  config.bucket_cap_bytes = std::max<int64_t>(1, z.reduce_bucket_size) * element_bytes;
  config.first_bucket_cap_bytes = std::min(config.first_bucket_cap_bytes, config.bucket_cap_bytes);
  // Stage 3: the engine bounds gathered units, not elements. The unit in use is always gathered (as in
  // DeepSpeed); beside it, as many of the largest sharded unit as fit in stage3_prefetch_bucket_size are
  // prefetched (none without overlap_comm), and no more than stage3_max_live_parameters allows in all.
  config.persistence_threshold = z.stage3_param_persistence_threshold;
  int64_t largest = 1;
  for (const UnitSize& u : units) {
    if (u.numel >= config.persistence_threshold) largest = std::max(largest, u.numel);
  }
  const int64_t prefetched = z.overlap_comm ? z.stage3_prefetch_bucket_size / largest : 0;
  config.max_live_units = static_cast<int>(std::clamp<int64_t>(
      std::min(1 + prefetched, z.stage3_max_live_parameters / largest), 1, static_cast<int64_t>(units.size())));
  config.accumulation_steps = static_cast<int>(batch.accumulation_steps);
  config.gradient_clipping = c.gradient_clipping;
  config.weight_decay = static_cast<float>(c.optimizer.weight_decay);
  config.seed = c.seed;
  config.time_phases = c.wall_clock_breakdown;
  if (z.offload_optimizer.device == "nvme") config.offload_optimizer_path = z.offload_optimizer.nvme_path;
  config.optimizer_swap = z.optimizer_swap;
  if (z.offload_param.device == "nvme") config.offload_param_path = z.offload_param.nvme_path;
  config.offload_optimizer_to_host = z.offload_optimizer.device == "cpu";
  config.offload_param_to_host = z.offload_param.device == "cpu";
  ZERO_RETURN_IF_ERROR(config.validate("zero_optimization."));
  if (c.memory_budget_mib == 0) return config;

  int64_t num_params = 0;
  for (const UnitSize& u : units) num_params += u.numel;
  const ModelStateBytes states = model_state_bytes(states_plan(c, num_params, world_size));
  const auto gathered = std::max_element(units.begin(), units.end(),
                                         [](const UnitSize& a, const UnitSize& b) { return a.numel < b.numel; });
  const bool gathers = StagePolicy(z.stage).partitions_params();
  const int64_t gathered_bytes = gathers ? gathered->numel * element_bytes : 0;
  const int64_t bucket_bytes =
      config.stages_gradients(world_size) ? largest_bucket_numel(units, config, world_size) * element_bytes : 0;
  const int64_t needed = states.on_device() + gathered_bytes + bucket_bytes;  // what the budget bounds
  const int64_t budget = c.memory_budget_mib << 20;
  if (needed <= budget) return config;
  const std::string params = absl::StrCat("params ", format_bytes(states.params), ", ");
  const std::string grads = absl::StrCat("grads ", format_bytes(states.grads));
  const std::string held =
      states.on_host == 0 ? absl::StrCat(params, grads, ", optimizer state ", format_bytes(states.optimizer_state),
                                         ", master weights ", format_bytes(states.master_weights))
      : config.offload_param_to_host
          ? absl::StrCat(grads, "; the params, optimizer state and master weights in host memory, outside the budget")
          : absl::StrCat(params, grads, "; the optimizer state and master weights in host memory, outside the budget");
  return absl::InvalidArgumentError(absl::StrCat(
      "memory_budget_mib = ", c.memory_budget_mib, ": a rank needs ", format_bytes(needed),
      " before any activation at stage ", z.stage, " on ", world_size, " ranks (", held,
      gathers ? absl::StrCat(", unit '", gathered->name, "' gathered ", format_bytes(gathered_bytes)) : "",
      ", largest gradient bucket ", format_bytes(bucket_bytes), "); raise the budget, the stage or the ranks"));
}

}  // namespace zero::train
