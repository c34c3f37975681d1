#include "models/gpt2_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/kernels.h"
#include "nlohmann/json.hpp"
#include "runtime/atomic_file.h"
#include "runtime/status.h"

namespace zero {
namespace {

// Every parameter of `config` with both layouts, in forward order.
std::vector<Gpt2HfTensor> hf_tensors(const Gpt2Config& config) {
  std::vector<Gpt2HfTensor> out;
  for (const Gpt2UnitParams& unit : gpt2_unit_params(config)) {
    for (const ParamSpec& spec : unit.params) {
      Gpt2HfTensor t{unit.unit, spec.name, spec.shape, spec.shape, false};
      if (spec.name == "wte.weight") {
        t.hf_shape = {config.vocab_size, config.channels};
      } else if (unit.unit != kGpt2EmbeddingUnit && spec.shape.size() == 2) {  // a block's Conv1D weight
        t.hf_shape = {spec.shape[1], spec.shape[0]};
        t.transposed = true;
      }
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::map<std::string, Gpt2HfTensor> by_hf_name(const std::vector<Gpt2HfTensor>& tensors) {
  std::map<std::string, Gpt2HfTensor> out;
  for (const Gpt2HfTensor& t : tensors) out.emplace(gpt2_hf_name(t.unit, t.param), t);
  return out;
}

// GPT2LMHeadModel.save_pretrained names GPT2Model's tensors "transformer.wte.weight", ...
constexpr absl::string_view kSavePretrainedPrefix = "transformer.";
// GPT2LMHeadModel's output head, tied to wte.
constexpr absl::string_view kLmHead = "lm_head.weight";

// The prefix of the file's names: kSavePretrainedPrefix when they carry it, else "" (GPT2Model's, the hub's gpt2).
std::string name_prefix(const SafetensorsFile& file) {
  const bool prefixed = std::any_of(file.entries().begin(), file.entries().end(), [](const SafetensorsEntry& e) {
    return absl::StartsWith(e.name, kSavePretrainedPrefix);
  });
  return prefixed ? std::string(kSavePretrainedPrefix) : "";
}

// HF's non-parameter buffers, by name: each block's causal mask (attn.bias) and masked_bias (older files).
std::set<std::string> buffer_names(const Gpt2Config& config, absl::string_view prefix) {
  std::set<std::string> out;
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    for (absl::string_view buffer : {"attn.bias", "attn.masked_bias"}) {
      out.insert(absl::StrCat(prefix, gpt2_hf_name(gpt2_block_unit(layer), buffer)));
    }
  }
  return out;
}

// The shape the file's tensor `name` (holding `t`) must have: Hugging Face's, except that wpe may have more
// positions than the model's max_seq_len: the model takes the first ones, as fine-tuning the hub's gpt2
// (1024 positions) at a shorter context does. Fewer are refused naming both counts.
absl::StatusOr<Shape> file_shape(const Tensor& stored, const std::string& path, const std::string& name,
                                 const Gpt2HfTensor& t) {
  const Shape& shape = stored.shape();
  if (t.param != "wpe.weight" || shape.size() != 2 || shape[1] != t.hf_shape[1]) return t.hf_shape;
  if (shape[0] < t.hf_shape[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor '", name, "' has ", shape[0], " positions but the model's max_seq_len is ",
                     t.hf_shape[0], "; train on sequences of at most ", shape[0], " tokens, or start from a file with ",
                     t.hf_shape[0], " positions or more"));
  }
  return shape;
}

// The file's tensor `name`, which holds `t`: present, F32/BF16/F16, in Hugging Face's shape (file_shape).
absl::StatusOr<Tensor> stored_tensor(const SafetensorsFile& file, const std::string& path, const std::string& name,
                                     const Gpt2HfTensor& t, const Gpt2Config& config) {
  if (!file.contains(name)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " has no tensor '", name, "' (", shape_string(t.hf_shape),
                                                   "); is it a GPT-2 checkpoint with ", config.num_layers, " layers?"));
  }
  ZERO_ASSIGN_OR_RETURN(const Tensor stored, file.get(name));
  if (!is_floating(stored.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' is ",
                                                   safetensors_dtype_name(stored.dtype()),
                                                   "; GPT-2 weights are F32, BF16 or F16"));
  }
  ZERO_ASSIGN_OR_RETURN(const Shape shape, file_shape(stored, path, name, t));
  return file.get(name, stored.dtype(), shape);
}

// Fails naming the first tensor of the file that is neither one of `tensors` (under `prefix`), a known
// buffer, nor the head.
absl::Status check_no_other_tensors(const SafetensorsFile& file, const std::string& path,
                                    const std::map<std::string, Gpt2HfTensor>& tensors, const std::string& prefix,
                                    const Gpt2Config& config) {
  const std::set<std::string> buffers = buffer_names(config, prefix);
  for (const SafetensorsEntry& entry : file.entries()) {
    const absl::string_view name = entry.name;
    const bool param = absl::StartsWith(name, prefix) && tensors.contains(std::string(name.substr(prefix.size())));
    if (!param && !buffers.contains(entry.name) && name != kLmHead) {
      return absl::InvalidArgumentError(absl::StrCat(path, " has tensor '", name, "', which a GPT-2 with ",
                                                     config.num_layers, " layers, ", config.channels,
                                                     " channels does not have; check the config"));
    }
  }
  return absl::OkStatus();
}

// zero ties the head to wte, as GPT2LMHeadModel does: a file's lm_head.weight (transformers writes it
// unless it drops tied copies) must be wte's values. Returns the note for the log, "" without one.
absl::StatusOr<std::string> check_tied_head(const SafetensorsFile& file, const std::string& path,
                                            const std::string& wte_name) {
  if (!file.contains(kLmHead)) return "";
  ZERO_ASSIGN_OR_RETURN(const Tensor wte, file.get(wte_name));
  ZERO_ASSIGN_OR_RETURN(const Tensor head, file.get(kLmHead));
  if (!is_floating(head.dtype()) || head.shape() != wte.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor '", kLmHead, "' is ", safetensors_dtype_name(head.dtype()),
                     shape_string(head.shape()), " but '", wte_name, "' is ", safetensors_dtype_name(wte.dtype()),
                     shape_string(wte.shape()), "; zero ties the head to wte, so the two must be the same tensor"));
  }
  for (int64_t i = 0; i < wte.numel(); ++i) {
    const float h = load_as_float(head.data(), head.dtype(), i);
    const float w = load_as_float(wte.data(), wte.dtype(), i);
    if (float_bits(h) != float_bits(w)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", kLmHead, "' differs from '", wte_name, "' at element ", i, " (", h, " vs ", w,
          "); zero ties the head to wte and cannot train an untied one: remove lm_head.weight from the file to "
          "start from wte"));
    }
  }
  return absl::StrCat(kLmHead, " equals wte.weight (the tied head)");
}

// "tensors in BF16, widened exactly to fp32" when any of `dtypes` is not F32, else "".
std::string widening_note(const std::set<DType>& dtypes) {
  std::vector<std::string> halves;
  for (DType dtype : dtypes) {
    if (dtype != DType::kF32) halves.emplace_back(safetensors_dtype_name(dtype));
  }
  return halves.empty() ? "" : absl::StrCat("tensors in ", absl::StrJoin(halves, " and "), ", widened exactly to fp32");
}

// "wpe.weight has 1024 positions; the model (max_seq_len 64) takes the first 64" when the file has more, else "".
std::string positions_note(int64_t positions, const Gpt2Config& config) {
  if (positions == config.max_seq_len) return "";
  return absl::StrCat("wpe.weight has ", positions, " positions; the model (max_seq_len ", config.max_seq_len,
                      ") takes the first ", config.max_seq_len);
}

// `t` in fp32: itself when it is fp32 (or no floating CPU tensor, for the caller's check to refuse), else
// widened exactly (bf16, fp16) into `buffer`.
absl::StatusOr<Tensor> widen_to_fp32(const Tensor& t, std::vector<float>& buffer) {
  if (!is_floating(t.dtype()) || t.dtype() == DType::kF32 || !t.device().is_cpu()) return t;
  buffer.resize(t.numel());
  const Tensor out(buffer.data(), DType::kF32, t.shape());
  ZERO_RETURN_IF_ERROR(kernels::cast(out, t));
  return out;
}

absl::Status check_finite(const std::string& name, const Tensor& values32) {
  const float* values = values32.data_as<float>();
  const float* end = values + values32.numel();
  if (const float* bad = std::find_if(values, end, [](float v) { return !std::isfinite(v); }); bad != end) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' holds ", *bad, " at element ", bad - values,
                                                   "; a model starts from finite weights"));
  }
  return absl::OkStatus();
}

// dst = src's leading elements, the rest of dst zero: wte's V rows fill zero's first V of Vp, and a wpe of
// more positions than max_seq_len gives its first max_seq_len rows.
void copy_leading(const Tensor& src, const Tensor& dst) {
  const size_t n = std::min(src.nbytes(), dst.nbytes());
  std::memcpy(dst.data(), src.data(), n);
  std::memset(static_cast<char*>(dst.data()) + n, 0, dst.nbytes() - n);
}

// dst (cols, rows) = src (rows, cols)^T.
void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
}

absl::StatusOr<const Gpt2HfTensor*> find_param(const std::map<std::string, Gpt2HfTensor>& tensors,
                                               absl::string_view unit, absl::string_view param) {
  auto it = tensors.find(gpt2_hf_name(unit, param));
  if (it == tensors.end() || it->second.unit != unit) {
    return absl::InvalidArgumentError(absl::StrCat("GPT-2 has no parameter '", param, "' in unit '", unit, "'"));
  }
  return &it->second;
}

absl::Status check_param_view(const Gpt2HfTensor& t, const Tensor& view) {
  if (view.dtype() != DType::kF32 || view.shape() != t.shape || !view.is_contiguous() || !view.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", t.param, "' of unit '", t.unit,
                                                   "' must be a contiguous fp32 CPU tensor of shape ",
                                                   shape_string(t.shape), "; got ", view.to_string()));
  }
  return absl::OkStatus();
}

// GPT-2's <|endoftext|>, its bos and eos token, in its own 50257-token vocabulary.
constexpr int64_t kGpt2Vocab = 50257;
constexpr int64_t kGpt2EndOfText = 50256;

nlohmann::ordered_json hf_config(const Gpt2Config& config) {
  nlohmann::ordered_json out = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", config.vocab_size},
      {"n_positions", config.max_seq_len},
      {"n_ctx", config.max_seq_len},  // older transformers size the attention mask by it
      {"n_embd", config.channels},
      {"n_layer", config.num_layers},
      {"n_head", config.num_heads},
      {"n_inner", nullptr},  // 4 * n_embd
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", 1e-5},  // kernels::kLayerNormEps, written as a double
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
  };
  if (config.vocab_size == kGpt2Vocab) {
    out["bos_token_id"] = kGpt2EndOfText;
    out["eos_token_id"] = kGpt2EndOfText;
  }
  return out;
}

// Whether config.json at `path` may be written: there is none, or it holds `config` already.
bool config_json_is_free(const std::filesystem::path& path, const std::string& config) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return true;
  std::ifstream in(path);
  const nlohmann::json there = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return !there.is_discarded() && there == nlohmann::json::parse(config);
}

}  // namespace

std::string gpt2_hf_config_json(const Gpt2Config& config) { return hf_config(config).dump(2) + "\n"; }

std::string gpt2_hf_export_file(const std::string& path) {
  std::error_code ec;
  if (!absl::EndsWith(path, "/") && !std::filesystem::is_directory(path, ec)) return path;
  return (std::filesystem::path(path) / "model.safetensors").string();
}

absl::StatusOr<Gpt2HfReader> Gpt2HfReader::open(const std::string& path, const Gpt2Config& config) {
  ZERO_RETURN_IF_ERROR(config.validate());
  ZERO_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::read(path));
  const std::string prefix = name_prefix(file);
  std::map<std::string, Gpt2HfTensor> tensors = by_hf_name(hf_tensors(config));
  std::set<DType> dtypes;
  int64_t positions = 0;
  for (const auto& [name, t] : tensors) {
    ZERO_ASSIGN_OR_RETURN(const Tensor stored, stored_tensor(file, path, prefix + name, t, config));
    dtypes.insert(stored.dtype());
    if (name == "wpe.weight") positions = stored.shape()[0];
  }
  ZERO_RETURN_IF_ERROR(check_no_other_tensors(file, path, tensors, prefix, config));
  ZERO_ASSIGN_OR_RETURN(const std::string head_note, check_tied_head(file, path, prefix + "wte.weight"));
  std::vector<std::string> notes;
  for (const std::string& note : {positions_note(positions, config), widening_note(dtypes), head_note}) {
    if (!note.empty()) notes.push_back(note);
  }
  return Gpt2HfReader(std::move(file), std::move(tensors), prefix, std::move(notes));
}

absl::Status Gpt2HfReader::fill(absl::string_view unit, absl::string_view param, const Tensor& dst) const {
  ZERO_ASSIGN_OR_RETURN(const Gpt2HfTensor* t, find_param(tensors_, unit, param));
  ZERO_RETURN_IF_ERROR(check_param_view(*t, dst));
  const std::string name = prefix_ + gpt2_hf_name(unit, param);
  ZERO_ASSIGN_OR_RETURN(const Tensor stored, file_.get(name));
  std::vector<float> buffer;
  ZERO_ASSIGN_OR_RETURN(const Tensor src, widen_to_fp32(stored, buffer));
  ZERO_RETURN_IF_ERROR(check_finite(name, src));
  if (t->transposed) {
    transpose(src.data_as<float>(), t->hf_shape[0], t->hf_shape[1], dst.data_as<float>());
  } else {
    copy_leading(src, dst);
  }
  return absl::OkStatus();
}

Gpt2HfWriter::Gpt2HfWriter(const Gpt2Config& config) : config_(config), order_(hf_tensors(config)) {}

absl::Status Gpt2HfWriter::add(absl::string_view unit, absl::string_view param, const Tensor& value) {
  auto it = std::find_if(order_.begin(), order_.end(),
                         [&](const Gpt2HfTensor& t) { return t.unit == unit && t.param == param; });
  if (it == order_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("GPT-2 has no parameter '", param, "' in unit '", unit, "'"));
  }
  // bf16 and fp16 weights are widened, exactly: the file holds the weights the model computed with.
  std::vector<float> buffer;
  ZERO_ASSIGN_OR_RETURN(const Tensor value32, widen_to_fp32(value, buffer));
  ZERO_RETURN_IF_ERROR(check_param_view(*it, value32));
  std::vector<float>& out = data_[gpt2_hf_name(unit, param)];
  out.resize(shape_numel(it->hf_shape));
  if (it->transposed) {
    transpose(value32.data_as<float>(), it->shape[0], it->shape[1], out.data());
  } else {
    std::memcpy(out.data(), value32.data(), out.size() * sizeof(float));  // wte: its first V rows
  }
  return absl::OkStatus();
}

absl::Status Gpt2HfWriter::write(const std::string& path) const {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Gpt2HfTensor& t : order_) {
    std::string name = gpt2_hf_name(t.unit, t.param);
    auto it = data_.find(name);
    if (it == data_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write ", path, ": parameter '", t.param, "' of unit '", t.unit, "' was never added"));
    }
    tensors.emplace_back(name, Tensor(const_cast<float*>(it->second.data()), DType::kF32, t.hf_shape));
  }
  return write_safetensors(path, tensors, {{"format", "pt"}});
}

absl::StatusOr<std::string> Gpt2HfWriter::export_to(const std::string& path) const {
  const std::filesystem::path model = gpt2_hf_export_file(path);
  ZERO_RETURN_IF_ERROR(write(model.string()));
  const std::filesystem::path config_path = model.parent_path() / "config.json";
  const std::string config = gpt2_hf_config_json(config_);
  if (model.filename() != "model.safetensors" && !config_json_is_free(config_path, config)) {
    return absl::StrCat("exported ", model.string(), "; kept ", config_path.string(),
                        ", which describes another model (export_path = a directory writes model.safetensors and "
                        "config.json in it)");
  }
  ZERO_RETURN_IF_ERROR(write_file_atomically(config_path.string(), {config}));
  return absl::StrCat("exported ", model.string(), " and ", config_path.string());
}

}  // namespace zero
