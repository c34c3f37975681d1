#include "examples/train/auto_values.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/gpt2_config.h"

namespace zero::train {
namespace {

using json = nlohmann::json;
using Fill = std::function<void(TrainConfig&)>;

// zero's own keys for which "auto" is a value of theirs, not the Trainer's placeholder.
const std::set<std::string, std::less<>> kAutoIsAValue = {
    "checkpoint.resume",  // resume from the newest checkpoint when there is one
};

void take_from(json& object, const std::string& prefix, std::vector<std::string>& keys) {
  for (auto it = object.begin(); it != object.end();) {
    const std::string key = prefix.empty() ? it.key() : absl::StrCat(prefix, ".", it.key());
    if (it->is_object()) take_from(*it, key, keys);
    if (*it != "auto" || kAutoIsAValue.contains(key)) {
      ++it;
      continue;
    }
    keys.push_back(key);
    it = object.erase(it);
  }
}

// The model's hidden size, which HF reads from the model's config: GPT-2's channels, the MLP's widest layer.
int64_t hidden_size(const ModelConfig& m) {
  if (m.type == "mlp") return m.widths.empty() ? 1 : *std::max_element(m.widths.begin(), m.widths.end());
  if (m.preset != "custom") {
    // An unknown preset is refused after the fill, naming model.preset.
    if (const absl::StatusOr<Gpt2Config> preset = Gpt2Config::preset(m.preset); preset.ok()) return preset->channels;
  }
  return m.channels;
}

// The key's default is what the Trainer would put there too: taking the "auto" out was the fill.
void keep_default(TrainConfig&) {}

// Any batch key the batch rule derives from the others; with neither batch size left, the Trainer's
// default micro-batch.
void fill_batch(TrainConfig& c) {
  if (!c.train_batch_size && !c.train_micro_batch_size_per_gpu) c.train_micro_batch_size_per_gpu = kAutoMicroBatch;
}

const std::map<std::string, Fill, std::less<>>& fills() {
  static const auto* table = new std::map<std::string, Fill, std::less<>>{
      {"train_batch_size", fill_batch},
      {"train_micro_batch_size_per_gpu", fill_batch},
      {"gradient_accumulation_steps", fill_batch},
      {"gradient_clipping", [](TrainConfig& c) { c.gradient_clipping = 1.0; }},
      {"optimizer.params.lr", keep_default},
      {"optimizer.params.betas", keep_default},
      {"optimizer.params.eps", keep_default},
      {"optimizer.params.weight_decay", keep_default},
      {"scheduler.params.warmup_min_lr", [](TrainConfig& c) { c.scheduler.warmup_min_lr = 0; }},
      {"scheduler.params.warmup_max_lr", [](TrainConfig& c) { c.scheduler.warmup_max_lr = c.optimizer.lr; }},
      {"scheduler.params.warmup_num_steps", [](TrainConfig& c) { c.scheduler.warmup_num_steps = 0; }},
      {"scheduler.params.total_num_steps", [](TrainConfig& c) { c.scheduler.total_num_steps = 0; }},  // = steps
      {"zero_optimization.reduce_bucket_size",
       [](TrainConfig& c) { c.zero_optimization.reduce_bucket_size = hidden_size(c.model) * hidden_size(c.model); }},
      {"zero_optimization.stage3_prefetch_bucket_size",
       [](TrainConfig& c) {
         c.zero_optimization.stage3_prefetch_bucket_size =
             static_cast<int64_t>(0.9 * static_cast<double>(hidden_size(c.model) * hidden_size(c.model)));
       }},
      {"zero_optimization.stage3_param_persistence_threshold",
       [](TrainConfig& c) { c.zero_optimization.stage3_param_persistence_threshold = 10 * hidden_size(c.model); }},
      {"fp16.enabled", [](TrainConfig& c) { c.fp16.enabled = false; }},
      {"bf16.enabled", [](TrainConfig& c) { c.bf16 = false; }},
      {"amp.enabled", keep_default},
  };
  return *table;
}

}  // namespace

std::vector<std::string> take_auto_values(json& root) {
  std::vector<std::string> keys;
  take_from(root, "", keys);
  return keys;
}

absl::Status fill_auto_values(const std::vector<std::string>& auto_keys,
                              const std::function<KeyFacts(const std::string&)>& facts, TrainConfig& config) {
  std::vector<std::string> unfilled;  // "key (its default)"
  for (const std::string& key : auto_keys) {
    if (const auto fill = fills().find(key); fill != fills().end()) {
      fill->second(config);
      continue;
    }
    const KeyFacts f = facts(key);
    if (f.takes_any_value) continue;
    unfilled.push_back(absl::StrCat(key, " (", f.default_value ? f.default_value->dump() : "no default", ")"));
  }
  if (unfilled.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("zero has no value for \"auto\" (the Hugging Face Trainer's placeholder) in ", unfilled.size(),
                   unfilled.size() == 1 ? " key" : " keys",
                   "; write a value for each, or remove it for the default shown: ", absl::StrJoin(unfilled, ", ")));
}

}  // namespace zero::train
