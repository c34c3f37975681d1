// zero-plan: per-rank memory by category, bytes sent per step, and the largest model that fits, for ZeRO stages 0-3.
//
// Model states and communication come from shard/plan.h (the ZeRO formulas, which plan_test holds the
// engine's measurements to); GPT-2 activations from the model's own shapes (models/gpt2.h), for a preset or a
// shape given by flags named as zero-train's model.* keys (--num_layers, --num_heads, --channels). With
// --offload_optimizer=nvme the master weights and optimizer state leave RAM for files, with --offload_optimizer=cpu
// (ZeRO-Offload, for an engine on a GPU) they live in host memory beside the device's params and grads, and with
// --offload_param=nvme stage 3's parameter shards, as in the engine.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/common/tool_flags.h"
#include "models/gpt2.h"
#include "models/gpt2_config.h"
#include "nlohmann/json.hpp"
#include "runtime/status.h"
#include "shard/flat_unit.h"
#include "shard/plan.h"
#include "shard/stage.h"

ABSL_FLAG(std::optional<std::string>, model, std::nullopt,
          "GPT-2 preset (zero-train's model.preset): tiny, d12 (gpt2-124M), d24 (gpt2-350M), d36 (gpt2-774M), "
          "d48 (gpt2-1.5B), or custom (the shape flags alone); the shape flags override a preset's sizes");
// The GPT-2 shape, named as zero-train's keys (model.num_layers, model.num_heads, model.channels,
// data.tokens.vocab_size) and Gpt2Config's fields; without --model they make a custom shape.
ABSL_FLAG(std::optional<int64_t>, num_layers, std::nullopt,
          "GPT-2 transformer blocks L (zero-train's model.num_layers)");
ABSL_FLAG(std::optional<int64_t>, num_heads, std::nullopt, "GPT-2 attention heads NH (zero-train's model.num_heads)");
ABSL_FLAG(std::optional<int64_t>, channels, std::nullopt,
          "GPT-2 width C, a multiple of --num_heads (zero-train's model.channels)");
ABSL_FLAG(std::optional<int64_t>, vocab_size, std::nullopt,
          "GPT-2 vocabulary V (zero-train's data.tokens.vocab_size); wte gets V rounded up to a multiple of 128 rows. "
          "Default: the preset's, or GPT-2's 50257");
ABSL_FLAG(std::optional<int64_t>, max_seq_len, std::nullopt,
          "GPT-2 positions maxT, the rows of wpe (zero-train takes it from the data's seq_len). "
          "Default: the preset's, or GPT-2's 1024");
ABSL_FLAG(std::optional<double>, params, std::nullopt,
          "a raw parameter count instead of a GPT-2 (--model or the shape flags), e.g. 7.5e9");
ABSL_FLAG(std::optional<int>, ranks, std::nullopt, "N, ranks sharing the model (or give --nodes and --gpus_per_node)");
ABSL_FLAG(std::optional<int>, nodes, std::nullopt, "nodes; N = nodes x gpus_per_node");
ABSL_FLAG(std::optional<int>, gpus_per_node, std::nullopt, "ranks per node");
ABSL_FLAG(std::string, stage, "all", "ZeRO stage 0, 1, 2, 3, or all (side by side)");
ABSL_FLAG(std::string, precision, "fp32", "parameters and gradients: fp32, or bf16/fp16 with fp32 master weights");
ABSL_FLAG(std::string, optimizer, "adamw",
          "adamw or adam (8 bytes of state per parameter: the ZeRO paper's K = 12 with the fp32 master copy), sgd (0) "
          "or sgd_momentum (4)");
ABSL_FLAG(std::string, offload_optimizer, "none",
          "none; nvme: master weights and optimizer state in files (ZeRO-Infinity), not in RAM; or cpu: fp32 master "
          "weights and optimizer state in host memory for an engine on a GPU (ZeRO-Offload)");
ABSL_FLAG(std::string, offload_param, "none",
          "none; nvme: stage 3's parameter shards in files (ZeRO-Infinity), not in RAM; or cpu (with "
          "--offload_optimizer cpu): in host memory beside the optimizer (ZeRO-Offload); stages 0-2 keep them");
ABSL_FLAG(int, gradient_accumulation_steps, 1, "micro-batches per optimizer step (each one is reduced)");
ABSL_FLAG(std::optional<int>, batch, std::nullopt, "GPT-2 micro-batch per rank B, for activations (with --seq)");
ABSL_FLAG(std::optional<int>, seq, std::nullopt, "GPT-2 sequence length T, for activations (with --batch)");
ABSL_FLAG(bool, recompute, false, "activations with every block recomputed in backward (checkpointing)");
ABSL_FLAG(std::optional<std::string>, memory, std::nullopt,
          "per-device memory with its unit, e.g. 80GB or 80GiB (a bare 80 is refused): prints whether the model fits "
          "and the largest that does");
ABSL_FLAG(std::optional<std::string>, host_memory, std::nullopt,
          "with --offload_optimizer=cpu: host memory per node, which its ranks share (--gpus_per_node of them, or all "
          "--ranks on one node), with its unit (e.g. 128GB): prints whether it holds what offload puts there (states "
          "and page-locked transfer buffers), and the largest model counts it too");
ABSL_FLAG(std::string, units, "GB", "units of the table: B, KB, KiB, MB, MiB, GB, GiB, TB or TiB");
ABSL_FLAG(bool, json, false, "print the figures as JSON (bytes) instead of the table");

namespace zero {
namespace {

absl::Status flag_error(absl::string_view flag, absl::string_view detail) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", detail));
}

// What to plan, from the flags.
struct Request {
  std::string model_name;  // empty for --params
  std::optional<Gpt2Config> gpt2;
  int nodes = 1;
  PlanInput plan;  // stage unset: one per entry of `stages`
  std::vector<int> stages;
  bool offload_param = false;          // to files; applies to stage 3
  bool offload_param_to_host = false;  // to host memory; applies to stage 3
  std::string optimizer;
  std::optional<int64_t> batch, seq;
  bool recompute = false;
  std::optional<int64_t> budget_bytes;
  std::string memory;                 // as given
  std::optional<int64_t> host_bytes;  // per node
  std::string host_memory;            // as given
  // Each rank's share of the node's host memory.
  std::optional<int64_t> host_bytes_per_rank() const {
    if (!host_bytes) return std::nullopt;
    return *host_bytes / (plan.world_size / nodes);
  }
  std::string units;
  int64_t unit_bytes = 1;
};

absl::StatusOr<int64_t> unit_size(absl::string_view unit) {
  constexpr std::pair<absl::string_view, int64_t> kUnits[] = {
      {"B", 1},           {"KB", 1'000},         {"KiB", 1LL << 10}, {"MB", 1'000'000},
      {"MiB", 1LL << 20}, {"GB", 1'000'000'000}, {"GiB", 1LL << 30}, {"TB", 1'000'000'000'000},
      {"TiB", 1LL << 40}};
  for (const auto& [name, bytes] : kUnits) {
    if (name == unit) return bytes;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown unit '", unit, "'; use B, KB, KiB, MB, MiB, GB, GiB, TB or TiB"));
}

// "80GB", "80 GiB", "1.5e9B". A bare number is refused: 80 could mean GB, GiB or bytes, and the two
// gigabytes differ by 7%, which is the difference between fitting and not.
absl::StatusOr<int64_t> parse_bytes(absl::string_view text) {
  const size_t split = text.find_first_not_of("0123456789.eE+- ");
  double value = 0;
  if (!absl::SimpleAtod(text.substr(0, split), &value) || !(value > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a positive size like 80GB or 80GiB"));
  }
  if (split == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' has no unit; add one, e.g. ", text, "GB or ", text,
                                                   "GiB (B, KB, KiB, MB, MiB, GB, GiB, TB or TiB)"));
  }
  ZERO_ASSIGN_OR_RETURN(const int64_t unit, unit_size(text.substr(split)));
  const double bytes = value * static_cast<double>(unit);
  if (!(bytes >= 1 && bytes < 9e18)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size from 1B to 9EB"));
  }
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<Gpt2Config> gpt2_preset(absl::string_view name) {
  constexpr std::pair<absl::string_view, absl::string_view> kAliases[] = {
      {"gpt2-124M", "d12"}, {"gpt2-350M", "d24"}, {"gpt2-774M", "d36"}, {"gpt2-1.5B", "d48"}};
  for (const auto& [alias, preset] : kAliases) {
    if (alias == name) return Gpt2Config::preset(preset);
  }
  return Gpt2Config::preset(name);
}

// A GPT-2 shape flag: its name, which is also its Gpt2Config field's, and the field.
struct ShapeFlag {
  absl::string_view name;
  const absl::Flag<std::optional<int64_t>>* flag;
  int64_t Gpt2Config::*field;
};

const std::vector<ShapeFlag>& shape_flags() {
  static const std::vector<ShapeFlag> kFlags = {{"num_layers", &FLAGS_num_layers, &Gpt2Config::num_layers},
                                                {"num_heads", &FLAGS_num_heads, &Gpt2Config::num_heads},
                                                {"channels", &FLAGS_channels, &Gpt2Config::channels},
                                                {"vocab_size", &FLAGS_vocab_size, &Gpt2Config::vocab_size},
                                                {"max_seq_len", &FLAGS_max_seq_len, &Gpt2Config::max_seq_len}};
  return kFlags;
}

// The flag to blame for Gpt2Config::validate()'s `error`, which names the field ("Gpt2Config.channels (768)
// must be a multiple of num_heads (7)"). A multiple that fails on a flag the user gave for the heads alone
// (the channels being the preset's) blames --num_heads.
std::string flag_of_validate_error(absl::string_view error, const std::vector<std::string>& given) {
  const auto was_given = [&](absl::string_view name) { return absl::c_linear_search(given, name); };
  if (absl::StrContains(error, "multiple of num_heads") && !was_given("channels") && was_given("num_heads")) {
    return "num_heads";
  }
  for (const ShapeFlag& shape : shape_flags()) {
    const std::string field = absl::StrCat("Gpt2Config.", shape.name);
    const size_t at = error.find(field);
    if (at != absl::string_view::npos && at + field.size() < error.size() && error[at + field.size()] == ' ') {
      return std::string(shape.name);
    }
  }
  return "model";
}

// The GPT-2 shape from --model and the shape flags: a preset with the flags given overriding its sizes, or
// with no --model (or --model custom) the flags alone. Named "d12", "d12 --num_layers=6" or "custom".
absl::Status resolve_gpt2(Request& r, const std::optional<std::string>& model) {
  std::vector<std::string> given;
  std::string overrides;
  for (const ShapeFlag& shape : shape_flags()) {
    if (const std::optional<int64_t> value = absl::GetFlag(*shape.flag)) {
      given.emplace_back(shape.name);
      absl::StrAppend(&overrides, " --", shape.name, "=", *value);
    }
  }
  const bool custom = !model.has_value() || *model == "custom";
  Gpt2Config config;  // GPT-2's vocabulary and positions, for a custom shape
  if (custom) {
    for (const absl::string_view required : {"num_layers", "num_heads", "channels"}) {
      if (!absl::c_linear_search(given, required)) {
        return flag_error(required,
                          "a custom GPT-2 shape (no --model preset) needs --num_layers, --num_heads and "
                          "--channels; --vocab_size and --max_seq_len default to GPT-2's 50257 and 1024");
      }
    }
    r.model_name = "custom";
  } else {
    absl::StatusOr<Gpt2Config> preset = gpt2_preset(*model);
    if (!preset.ok()) return flag_error("model", absl::StrCat(preset.status().message(), ", or custom"));
    config = *preset;
    r.model_name = absl::StrCat(*model, overrides);
  }
  // Beyond these sizes the count overflows, and every layer is a unit the plan pads separately.
  constexpr int64_t kMaxLayers = 100'000, kMaxSize = int64_t{1} << 31;
  for (const ShapeFlag& shape : shape_flags()) {
    const std::optional<int64_t> value = absl::GetFlag(*shape.flag);
    if (!value.has_value()) continue;
    const int64_t most = shape.name == "num_layers" ? kMaxLayers : kMaxSize;
    if (*value > most) {
      return flag_error(shape.name, absl::StrCat(*value, " is above the ", most, " zero-plan plans for"));
    }
    config.*shape.field = *value;
  }
  config.padded_vocab_size = padded_vocab(config.vocab_size);
  if (const absl::Status valid = config.validate(); !valid.ok()) {
    return flag_error(flag_of_validate_error(valid.message(), given), valid.message());
  }
  const double C = static_cast<double>(config.channels);
  const double approx = static_cast<double>(config.num_layers) * (12 * C * C + 13 * C) +
                        static_cast<double>(config.padded_vocab_size + config.max_seq_len + 2) * C;
  if (approx > 1e15) {
    return flag_error(given.empty() ? "model" : given.front(),
                      absl::StrFormat("the shape has %.3g parameters, above the 1e15 zero-plan plans for", approx));
  }
  r.gpt2 = config;
  r.plan.params = config.num_parameters();
  return absl::OkStatus();
}

// The first GPT-2 shape flag on the command line, if any.
std::optional<absl::string_view> first_shape_flag_given() {
  for (const ShapeFlag& s : shape_flags()) {
    if (absl::GetFlag(*s.flag).has_value()) return s.name;
  }
  return std::nullopt;
}

absl::Status resolve_model(Request& r) {
  const std::optional<std::string> model = absl::GetFlag(FLAGS_model);
  const std::optional<double> params = absl::GetFlag(FLAGS_params);
  const std::optional<absl::string_view> shape_flag = first_shape_flag_given();
  if (params.has_value()) {
    if (model.has_value()) return flag_error("model", "give exactly one of --model and --params");
    if (shape_flag.has_value()) {
      return flag_error(*shape_flag,
                        "sets a GPT-2 shape, which --params replaces with a raw count; give one or the other");
    }
    if (!(*params >= 1 && *params < 9e18)) return flag_error("params", absl::StrCat(*params, " is not a count >= 1"));
    r.plan.params = static_cast<int64_t>(*params);
    return absl::OkStatus();
  }
  if (!model.has_value() && !shape_flag.has_value()) {
    return flag_error("model",
                      "give exactly one of --model and --params (or a GPT-2 shape: --num_layers, "
                      "--num_heads, --channels)");
  }
  return resolve_gpt2(r, model);
}

absl::Status resolve_world(Request& r) {
  const std::optional<int> ranks = absl::GetFlag(FLAGS_ranks);
  const std::optional<int> nodes = absl::GetFlag(FLAGS_nodes);
  const std::optional<int> per_node = absl::GetFlag(FLAGS_gpus_per_node);
  if (nodes.has_value() != per_node.has_value()) {
    return flag_error("nodes", "give --nodes and --gpus_per_node together");
  }
  if (ranks.has_value() == nodes.has_value()) {
    return flag_error("ranks", "give either --ranks or --nodes with --gpus_per_node");
  }
  if (ranks.has_value() && *ranks < 1) return flag_error("ranks", absl::StrCat(*ranks, " is not a count >= 1"));
  if (nodes.has_value() && (*nodes < 1 || *per_node < 1)) {
    return flag_error("nodes", absl::StrCat(*nodes, " x ", *per_node, " is not a count >= 1 of each"));
  }
  r.nodes = nodes.value_or(1);
  r.plan.world_size = ranks.has_value() ? *ranks : *nodes * *per_node;
  if (r.gpt2.has_value()) {  // the engine pads every flat unit to a multiple of N
    for (const Gpt2UnitParams& unit : gpt2_unit_params(*r.gpt2)) {
      r.plan.padded_params += FlatLayout::of(unit.params, r.plan.world_size).padded_numel;
    }
  }
  return absl::OkStatus();
}

// --offload_optimizer and --offload_param: none, cpu (host memory, an engine on a GPU) or nvme (files, one on the CPU).
absl::StatusOr<std::string> offload_target(absl::string_view name, const absl::Flag<std::string>& flag) {
  std::string value = absl::GetFlag(flag);
  if (value != "none" && value != "cpu" && value != "nvme") {
    return flag_error(name, absl::StrCat("'", value, "' is not none, cpu or nvme"));
  }
  return value;
}

absl::Status resolve_training(Request& r) {
  const std::string stage = absl::GetFlag(FLAGS_stage);
  int single = 0;
  if (stage == "all") {
    r.stages = {0, 1, 2, 3};
  } else if (absl::SimpleAtoi(stage, &single) && single >= 0 && single <= 3) {
    r.stages = {single};
  } else {
    return flag_error("stage", absl::StrCat("'", stage, "' is not 0, 1, 2, 3 or all"));
  }
  const std::string precision = absl::GetFlag(FLAGS_precision);
  if (precision == "fp32")
    r.plan.precision = DType::kF32;
  else if (precision == "bf16")
    r.plan.precision = DType::kBF16;
  else if (precision == "fp16")
    r.plan.precision = DType::kF16;
  else
    return flag_error("precision", absl::StrCat("'", precision, "' is not fp32, bf16 or fp16"));
  r.optimizer = absl::GetFlag(FLAGS_optimizer);
  if (r.optimizer == "adamw" || r.optimizer == "adam")  // the same two moments
    r.plan.optimizer_state_bytes = 8;
  else if (r.optimizer == "sgd")
    r.plan.optimizer_state_bytes = 0;
  else if (r.optimizer == "sgd_momentum")
    r.plan.optimizer_state_bytes = 4;
  else
    return flag_error("optimizer", absl::StrCat("'", r.optimizer, "' is not adamw, adam, sgd or sgd_momentum"));
  ZERO_ASSIGN_OR_RETURN(const std::string optimizer_to, offload_target("offload_optimizer", FLAGS_offload_optimizer));
  ZERO_ASSIGN_OR_RETURN(const std::string param_to, offload_target("offload_param", FLAGS_offload_param));
  r.plan.offload_optimizer = optimizer_to == "nvme";
  r.plan.offload_optimizer_to_host = optimizer_to == "cpu";
  r.offload_param = param_to == "nvme";
  r.offload_param_to_host = param_to == "cpu";
  if (r.offload_param && r.plan.offload_optimizer_to_host) {
    return flag_error("offload_param",
                      "nvme moves a CPU engine's parameter shards to files, and --offload_optimizer "
                      "cpu plans an engine on a GPU; pick one");
  }
  if (r.offload_param_to_host && !r.plan.offload_optimizer_to_host) {
    return flag_error("offload_param",
                      "cpu keeps the shards in host memory beside the optimizer, which writes them: "
                      "give --offload_optimizer cpu too");
  }
  if ((r.offload_param || r.offload_param_to_host) && r.stages.size() == 1 && r.stages[0] != 3) {
    return flag_error("offload_param", absl::StrCat(param_to, " moves the parameter shards of stage 3, and stage ",
                                                    r.stages[0], " keeps every parameter whole; use --stage 3 or all"));
  }
  r.plan.accumulation_steps = absl::GetFlag(FLAGS_gradient_accumulation_steps);
  if (r.plan.accumulation_steps < 1) {
    return flag_error("gradient_accumulation_steps", absl::StrCat(r.plan.accumulation_steps, " is not >= 1"));
  }
  return absl::OkStatus();
}

absl::Status resolve_activations(Request& r) {
  const std::optional<int> batch = absl::GetFlag(FLAGS_batch), seq = absl::GetFlag(FLAGS_seq);
  r.recompute = absl::GetFlag(FLAGS_recompute);
  if (!batch.has_value() && !seq.has_value()) {
    return r.recompute ? flag_error("recompute", "needs --batch and --seq") : absl::OkStatus();
  }
  if (!r.gpt2.has_value()) return flag_error("batch", "activations need a GPT-2 --model, not --params");
  if (batch.has_value() != seq.has_value()) return flag_error("batch", "give --batch and --seq together");
  if (*batch < 1) return flag_error("batch", absl::StrCat(*batch, " is not >= 1"));
  if (*seq < 1 || *seq > r.gpt2->max_seq_len) {
    return flag_error("seq", absl::StrCat(*seq, " is outside 1 to the model's max_seq_len ", r.gpt2->max_seq_len));
  }
  r.batch = *batch;
  r.seq = *seq;
  return absl::OkStatus();
}

absl::Status resolve_output(Request& r) {
  r.units = absl::GetFlag(FLAGS_units);
  absl::StatusOr<int64_t> unit = unit_size(r.units);
  if (!unit.ok()) return flag_error("units", unit.status().message());
  r.unit_bytes = *unit;
  if (const std::optional<std::string> memory = absl::GetFlag(FLAGS_memory)) {
    absl::StatusOr<int64_t> bytes = parse_bytes(*memory);
    if (!bytes.ok()) return flag_error("memory", bytes.status().message());
    r.budget_bytes = *bytes;
    r.memory = *memory;
  }
  if (const std::optional<std::string> host_memory = absl::GetFlag(FLAGS_host_memory)) {
    if (!r.plan.offload_optimizer_to_host) {
      return flag_error("host_memory", "counts what --offload_optimizer=cpu puts in host memory; give that too");
    }
    if (!r.budget_bytes) return flag_error("host_memory", "give the device's --memory with it");
    absl::StatusOr<int64_t> bytes = parse_bytes(*host_memory);
    if (!bytes.ok()) return flag_error("host_memory", bytes.status().message());
    r.host_bytes = *bytes;
    r.host_memory = *host_memory;
  }
  return absl::OkStatus();
}

absl::StatusOr<Request> request_from_flags() {
  Request r;
  ZERO_RETURN_IF_ERROR(resolve_model(r));
  ZERO_RETURN_IF_ERROR(resolve_world(r));
  ZERO_RETURN_IF_ERROR(resolve_training(r));
  ZERO_RETURN_IF_ERROR(resolve_activations(r));
  ZERO_RETURN_IF_ERROR(resolve_output(r));
  ZERO_RETURN_IF_ERROR(r.plan.validate());
  return r;
}

// One stage's figures.
struct StagePlan {
  int stage = 0;
  ModelStateBytes model_states;
  int64_t activations = 0;
  CommBytes sent;
  int64_t total() const { return model_states.total() + activations; }
  int64_t on_device() const { return model_states.on_device() + activations; }  // what --memory must hold
  std::optional<bool> fits;                                                     // with --memory: on_device() within it
  std::optional<bool> fits_host;          // with --host_memory: the states' host memory within a rank's share
  std::optional<int64_t> largest_params;  // with --memory: model states only
};

std::vector<StagePlan> plan_stages(const Request& r) {
  const int64_t activations =
      r.batch.has_value() ? gpt2_peak_activation_bytes(*r.gpt2, *r.batch, *r.seq, r.recompute, r.plan.precision) : 0;
  std::vector<StagePlan> plans;
  for (int stage : r.stages) {
    PlanInput input = r.plan;
    input.stage = stage;
    input.offload_param = r.offload_param && StagePolicy(stage).partitions_params();
    input.offload_param_to_host = r.offload_param_to_host && StagePolicy(stage).partitions_params();
    StagePlan p{.stage = stage,
                .model_states = model_state_bytes(input),
                .activations = activations,
                .sent = comm_bytes_per_step(input)};
    if (r.budget_bytes.has_value()) {
      p.fits = p.on_device() <= *r.budget_bytes;
      p.largest_params = largest_params_that_fit(input, *r.budget_bytes, 0, r.host_bytes_per_rank());
    }
    if (r.host_bytes.has_value()) p.fits_host = p.model_states.host_memory() <= *r.host_bytes_per_rank();
    plans.push_back(p);
  }
  return plans;
}

nlohmann::json to_json(const Request& r, const std::vector<StagePlan>& plans) {
  nlohmann::json out = {{"params", r.plan.params},
                        {"padded_params", r.plan.padded()},
                        {"world_size", r.plan.world_size},
                        {"nodes", r.nodes},
                        {"precision", std::string(dtype_name(r.plan.precision))},
                        {"optimizer", r.optimizer},
                        {"optimizer_state_bytes_per_param", r.plan.optimizer_state_bytes},
                        {"gradient_accumulation_steps", r.plan.accumulation_steps}};
  if (r.gpt2.has_value()) {
    out["model"] = r.model_name;
    const Gpt2Config& g = *r.gpt2;
    out["gpt2"] = {{"num_layers", g.num_layers},
                   {"num_heads", g.num_heads},
                   {"channels", g.channels},
                   {"vocab_size", g.vocab_size},
                   {"padded_vocab_size", g.padded_vocab_size},
                   {"max_seq_len", g.max_seq_len}};
  }
  if (r.batch.has_value()) out["activations"] = {{"batch", *r.batch}, {"seq", *r.seq}, {"recompute", r.recompute}};
  if (r.budget_bytes.has_value()) out["memory_bytes"] = *r.budget_bytes;
  if (r.host_bytes.has_value()) out["host_memory_bytes"] = *r.host_bytes;
  for (const StagePlan& p : plans) {
    const ModelStateBytes& m = p.model_states;
    nlohmann::json stage = {
        {"stage", p.stage},
        {"bytes",
         {{"params", m.params},
          {"grads", m.grads},
          {"master_weights", m.master_weights},
          {"optimizer_state", m.optimizer_state},
          {"in_files", m.in_files},
          {"on_host", m.on_host},
          {"transfer_buffers", m.transfer_buffers},
          {"model_states", m.total()},
          {"activations", p.activations},
          {"total", p.total()}}},
        {"comm_bytes_per_step",
         {{"param_gather", p.sent.param_gather}, {"grad_reduce", p.sent.grad_reduce}, {"total", p.sent.total()}}}};
    if (r.budget_bytes.has_value()) {
      stage["fits"] = *p.fits;
      if (p.fits_host.has_value()) stage["fits_host"] = *p.fits_host;
      stage["largest_params_that_fit"] = *p.largest_params;
    }
    out["stages"].push_back(stage);
  }
  return out;
}

// Rows of cells printed with the first column left-aligned and the others right-aligned.
std::string aligned(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string text;
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&text,
                      c == 0 ? absl::StrFormat("%-*s", width[c], row[c]) : absl::StrFormat("  %*s", width[c], row[c]));
    }
    absl::StrAppend(&text, "\n");
  }
  return text;
}

std::string count_text(int64_t n) {
  if (n >= 1'000'000'000) return absl::StrFormat("%.2fB", static_cast<double>(n) / 1e9);
  if (n >= 1'000'000) return absl::StrFormat("%.2fM", static_cast<double>(n) / 1e6);
  return absl::StrCat(n);
}

std::string with_commas(int64_t n) {
  const std::string digits = absl::StrCat(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string heading(const Request& r) {
  std::string model;
  if (r.gpt2.has_value()) {
    const Gpt2Config& g = *r.gpt2;
    model = absl::StrCat("GPT-2 ", r.model_name, ": num_layers ", g.num_layers, ", num_heads ", g.num_heads,
                         ", channels ", g.channels, ", vocab_size ", g.vocab_size, " (wte ", g.padded_vocab_size,
                         " rows), max_seq_len ", g.max_seq_len, "\n");
  }
  const std::string nodes =
      r.nodes > 1 ? absl::StrCat(" (", r.nodes, " nodes x ", r.plan.world_size / r.nodes, ")") : std::string();
  const std::string master = r.plan.precision == DType::kF32 ? "" : " + fp32 master weights";
  return absl::StrCat(model, with_commas(r.plan.params), " parameters (", with_commas(r.plan.padded()),
                      " padded) over ", r.plan.world_size, " ranks", nodes, "\n", dtype_name(r.plan.precision), master,
                      ", ", r.optimizer, " (", r.plan.optimizer_state_bytes,
                      " bytes of state per parameter), gradient accumulation ", r.plan.accumulation_steps, "\n\n");
}

std::string to_text(const Request& r, const std::vector<StagePlan>& plans) {
  const auto row = [&](const std::string& name, auto value) {
    std::vector<std::string> cells = {name};
    for (const StagePlan& p : plans) cells.push_back(value(p));
    return cells;
  };
  const auto bytes = [&](const std::string& name, auto field) {
    return row(name, [&](const StagePlan& p) {
      return absl::StrFormat("%.3f", static_cast<double>(field(p)) / static_cast<double>(r.unit_bytes));
    });
  };
  std::vector<std::vector<std::string>> rows = {
      row(absl::StrCat("per rank, ", r.units), [](const StagePlan& p) { return absl::StrCat("stage ", p.stage); }),
      bytes("  params", [](const StagePlan& p) { return p.model_states.params; }),
      bytes("  grads", [](const StagePlan& p) { return p.model_states.grads; }),
      bytes("  master weights", [](const StagePlan& p) { return p.model_states.master_weights; }),
      bytes("  optimizer state", [](const StagePlan& p) { return p.model_states.optimizer_state; }),
      bytes("  model states", [](const StagePlan& p) { return p.model_states.total(); })};
  if (r.plan.offload_optimizer || r.offload_param) {
    rows.push_back(bytes("  in files (NVMe)", [](const StagePlan& p) { return p.model_states.in_files; }));
  }
  if (r.plan.offload_optimizer_to_host) {
    rows.push_back(bytes("  on the device", [](const StagePlan& p) { return p.model_states.on_device(); }));
    rows.push_back(bytes("  in host memory", [](const StagePlan& p) { return p.model_states.on_host; }));
    rows.push_back(bytes("  + pinned transfers", [](const StagePlan& p) { return p.model_states.transfer_buffers; }));
  }
  if (r.batch.has_value()) {
    rows.push_back(bytes(absl::StrCat("  activations B=", *r.batch, " T=", *r.seq, r.recompute ? " recompute" : ""),
                         [](const StagePlan& p) { return p.activations; }));
    rows.push_back(bytes("  total", [](const StagePlan& p) { return p.total(); }));
  }
  rows.push_back(bytes("sent per step", [](const StagePlan& p) { return p.sent.total(); }));
  rows.push_back(bytes("  param allgather", [](const StagePlan& p) { return p.sent.param_gather; }));
  rows.push_back(bytes("  grad reduce", [](const StagePlan& p) { return p.sent.grad_reduce; }));
  if (r.budget_bytes.has_value()) {
    rows.push_back(row(absl::StrCat("fits in ", r.memory), [](const StagePlan& p) { return *p.fits ? "yes" : "no"; }));
    if (r.host_bytes.has_value()) {
      rows.push_back(row(absl::StrCat("host holds it in ", r.host_memory),
                         [](const StagePlan& p) { return *p.fits_host ? "yes" : "no"; }));
    }
    rows.push_back(row(absl::StrCat("largest model in ", r.memory, r.host_bytes ? " + " + r.host_memory : ""),
                       [](const StagePlan& p) { return count_text(*p.largest_params); }));
  }
  std::string notes =
      "\nStage 3 gathers every unit once per forward and once per backward (persistence_threshold 0); the\n"
      "engine sends less where it keeps a unit the next gathers need again, and more where a unit using\n"
      "another's tied parameters (GPT-2's head, wte) gathers that unit again.\n"
      "Not counted: gradient buckets and gathered units in flight, workspace, the loader's tokens, and on\n"
      "the CPU the fp32 copies a bf16/fp16 GEMM or attention works on.\n";
  if (r.budget_bytes.has_value()) absl::StrAppend(&notes, "The largest model counts model states only.\n");
  if (r.budget_bytes.has_value() && r.plan.offload_optimizer_to_host) {
    absl::StrAppend(
        &notes,
        "With the optimizer in host memory, --memory is the device's: only the device's rows count "
        "against it, and the host must hold the rest",
        r.host_bytes ? absl::StrCat(" (--host_memory per node, shared by its ", r.plan.world_size / r.nodes, " ranks)")
                     : std::string(),
        ".\n");
  }
  return absl::StrCat(heading(r), aligned(rows), notes);
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) {
  const std::vector<char*> args = zero::parse_tool_flags(
      argc, argv,
      "Per-rank memory by category, bytes sent per step and the largest model that fits, for ZeRO stages 0-3.\n\n"
      "usage: zero-plan (--model d12 [--num_layers L ...] | --num_layers L --num_heads NH --channels C\n"
      "                  | --params 7.5e9) (--ranks N | --nodes A --gpus_per_node B) [--flag=value ...]",
      "examples/zero_plan.cc");
  if (args.size() > 1) {
    std::fprintf(stderr, "zero-plan: unexpected argument '%s'; every input is a --flag (--help lists them)\n", args[1]);
    return 2;
  }
  const absl::StatusOr<zero::Request> request = zero::request_from_flags();
  if (!request.ok()) {
    std::fprintf(stderr, "zero-plan: %s\n", std::string(request.status().message()).c_str());
    return 2;
  }
  const std::vector<zero::StagePlan> plans = zero::plan_stages(*request);
  const std::string out =
      absl::GetFlag(FLAGS_json) ? zero::to_json(*request, plans).dump(2) + "\n" : zero::to_text(*request, plans);
  std::fputs(out.c_str(), stdout);
  return 0;
}
